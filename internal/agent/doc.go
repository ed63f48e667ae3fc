// Package agent is the host side of the protocol between spaced and space-agent, the init process
// of every sandbox: a Client over Connect-RPC (process.Process, filesystem.Filesystem) and HTTP
// (/files, /health), wire-compatible with E2B's envd. The in-sandbox server is agent/server.
// Errors from the agent are mapped to errdefs classes here, so callers never see Connect codes.
// Imported by the sandbox lifecycle and the API layer's helpers; imports agentpb and errdefs.
package agent
