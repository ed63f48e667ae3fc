// Package api is spaced's HTTP surface (API.md): routing, authentication, strict request
// decoding, error mapping, JSON and server-sent-event responses, metrics. It is thin: every
// decision about sandboxes is the sandbox package's. Imported only by cmd/spaced.
package api
