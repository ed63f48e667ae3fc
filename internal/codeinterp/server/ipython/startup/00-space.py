# Startup of the SPACE code-interpreter's python kernels (the server copies this
# file into the startup dir of the IPython profile it owns). It runs in the
# user's namespace, so it leaves no names behind.


def _space_setup():
    import json
    import os
    import sys
    import types

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter

    ip = get_ipython()
    if ip is None:
        return

    # A dict or list as a cell's value also gets application/json (E2B users
    # read result.json), when it is plain JSON data.
    def as_json(obj):
        try:
            return json.loads(json.dumps(obj, allow_nan=False))
        except (TypeError, ValueError, RecursionError):
            return None

    formatters = ip.display_formatter.formatters
    json_formatter = formatters.get("application/json")
    if json_formatter is not None:
        json_formatter.for_type(dict, as_json)
        json_formatter.for_type(list, as_json)

    # e2b/data for a pandas DataFrame (result.data in the SDK): its columns as
    # lists, NaN as null, timestamps as ISO strings. Skipped for big frames.
    class DataFormatter(BaseFormatter):
        format_type = "e2b/data"
        print_method = "_repr_e2b_data_"
        _return_type = (dict,)

    def frame_data(df):
        if df.size > 100_000:
            return None
        try:
            return {str(col): json.loads(df[col].to_json(orient="values", date_format="iso")) for col in df.columns}
        except Exception:
            return None

    data_formatter = DataFormatter(parent=ip.display_formatter)
    data_formatter.for_type_by_name("pandas.core.frame", "DataFrame", frame_data)
    formatters["e2b/data"] = data_formatter

    # Env vars for one cell: the server runs push() as a silent execution before
    # the cell; they are restored when the cell ends, by IPython's post_run_cell
    # event (fired in a finally, also after an error or an interrupt, and not for
    # silent executions), so no further request is needed after the cell.
    env = types.ModuleType("_space_env")
    undo = []

    def push(cell_env, global_env=None):
        if global_env:
            os.environ.update(global_env)
        if cell_env:
            undo.append({k: os.environ.get(k) for k in cell_env})
            os.environ.update(cell_env)

    def restore(result=None):
        while undo:
            for k, v in undo.pop().items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    env.push = push
    env.restore = restore
    sys.modules["_space_env"] = env
    ip.events.register("post_run_cell", restore)


_space_setup()
del _space_setup
