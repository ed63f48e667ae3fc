// Package space is the root of the SPACE module: sandboxes for AI agents. The code lives in
// cmd/ (spaced, space, space-agent, space-bench), internal/ and pkg/client; see
// docs/ARCHITECTURE.md. This package holds only module-wide tests.
package space
