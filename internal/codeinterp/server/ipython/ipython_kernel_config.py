# IPython kernel config of the SPACE code-interpreter server. The server copies
# this file into the profile dir it owns (IPYTHONDIR) at every start.
c = get_config()  # noqa: F821 (provided by traitlets when IPython loads the file)

# Plain tracebacks: no ANSI escapes in an error's value or traceback.
c.InteractiveShell.colors = "NoColor"
# No history database: dozens of kernels would contend for one sqlite file.
c.HistoryManager.hist_file = ":memory:"
# Figures as PNG (the inline backend is chosen by MPLBACKEND, set by the server).
c.InlineBackend.figure_formats = {"png"}
