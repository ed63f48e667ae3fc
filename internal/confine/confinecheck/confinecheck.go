// Package confinecheck is the lint pass that keeps host code from resolving paths inside trees
// a sandbox or an image wrote except through internal/confine. In the packages that handle
// such trees (Packages), a call of a path-taking file-system function of os, path/filepath,
// io/fs, syscall or golang.org/x/sys/unix is reported unless the line, or the line above it,
// carries a `//confine:host <why>` comment saying that the path is the host's own (a file under
// SPACE_HOME that spaced wrote, /proc of the host, a host binary), never one beneath a sandbox's
// or image's tree. A package that starts to handle such trees joins Packages. Run by
// `make lint` through cmd/space-lint; imported by nothing else.
package confinecheck

import (
	"go/ast"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// Analyzer reports unconfined file-system calls.
var Analyzer = &analysis.Analyzer{
	Name: "confine",
	Doc:  "report file-system calls by path in packages that handle sandbox or image trees, unless marked //confine:host",
	Run:  run,
}

// Packages are the import paths (of this module) whose code handles trees a sandbox or an
// image wrote.
var Packages = []string{
	"internal/fstree",
	"internal/runtime/gvisor",
	"internal/sandbox",
	"internal/snapshot",
	"internal/template",
	"internal/template/build",
	"internal/image",
	"internal/durable",
}

// Marker is the comment that says a call's path is the host's own.
const Marker = "//confine:host"

// flagged lists, per package path, the functions that resolve a path by name.
var flagged = map[string]map[string]bool{
	"os": set("Open", "OpenFile", "ReadFile", "WriteFile", "Stat", "Lstat", "ReadDir", "Readlink",
		"Create", "MkdirAll", "Symlink", "Link", "Chmod", "Chown", "Lchown", "Chtimes",
		"OpenRoot", "OpenInRoot", "DirFS", "CopyFS"),
	"path/filepath": set("Walk", "WalkDir", "EvalSymlinks", "Glob"),
	"io/fs":         set("WalkDir", "ReadDir", "ReadFile", "Stat", "Glob"),
	"syscall": set("Open", "Openat", "Stat", "Lstat", "Mknod", "Mkfifo", "Chown", "Lchown", "Chmod",
		"Readlink", "Symlink", "Link", "UtimesNano", "Setxattr", "Getxattr", "Listxattr"),
	"golang.org/x/sys/unix": set("Open", "Openat", "Stat", "Lstat", "Mknod", "Mknodat", "Mkfifo",
		"Mkfifoat", "Chown", "Lchown", "Chmod", "Fchmodat", "Fchownat", "Readlink", "Readlinkat",
		"Symlink", "Symlinkat", "Link", "Linkat", "UtimesNanoAt", "Utimes", "Setxattr", "Lsetxattr",
		"Getxattr", "Lgetxattr", "Listxattr", "Llistxattr", "Fstatat", "Openat2"),
}

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// covered reports whether pkg (an import path) is one of Packages, in any module.
func covered(pkg string) bool {
	for _, p := range Packages {
		if pkg == p || strings.HasSuffix(pkg, "/"+p) {
			return true
		}
	}
	return false
}

func run(pass *analysis.Pass) (any, error) {
	if !covered(pass.Pkg.Path()) {
		return nil, nil
	}
	for _, f := range pass.Files {
		name := pass.Fset.File(f.Pos()).Name()
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		marked := map[int]bool{} // lines carrying the marker
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if strings.HasPrefix(c.Text, Marker) {
					marked[pass.Fset.Position(c.Pos()).Line] = true
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
			if !ok || fn.Pkg() == nil || fn.Type().(*types.Signature).Recv() != nil {
				return true
			}
			if !flagged[fn.Pkg().Path()][fn.Name()] {
				return true
			}
			line := pass.Fset.Position(call.Pos()).Line
			if marked[line] || marked[line-1] {
				return true
			}
			pass.Reportf(call.Pos(), "%s.%s resolves a path by name: use internal/confine for trees a sandbox or an image wrote, or mark a host-owned path with %s <why>",
				fn.Pkg().Name(), fn.Name(), Marker)
			return true
		})
	}
	return nil, nil
}
