// Command cachecount counts what issue 23 counts of the library's Cache
// type, and of cache, the byte-level core behind it: their fields, and
// their methods, exported and unexported, by file.
//
//	cd bench && go run ./cachecount        # the library: ..
//	go run ./cachecount -dir ../some/dir   # another package directory
//	go run ./cachecount -max 30            # fail above issue 23's bound (CI)
//
// It reads the package's non-test files with go/parser, so a method of
// Cache is counted whatever its receiver is named and whether or not the
// receiver is a pointer; methods of other types (a facade's internals)
// are not Cache's and are not counted.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	dir := flag.String("dir", "..", "the package directory")
	types := flag.String("type", "Cache,cache", "the types whose fields and methods are counted, separated by commas")
	most := flag.Int("max", 0, "fail if a type has more methods than this (issue 23: 30); 0: no bound")
	flag.Parse()
	fs := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(*dir, "*.go"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cachecount:", err)
		os.Exit(1)
	}
	parsed := map[string]*ast.File{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cachecount:", err)
			os.Exit(1)
		}
		parsed[name] = f
	}
	failed := false
	for _, typ := range strings.Split(*types, ",") {
		if n := count(parsed, typ); *most > 0 && n > *most {
			fmt.Fprintf(os.Stderr, "cachecount: %s has %d methods, more than %d\n", typ, n, *most)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// count prints typ's fields and its methods by file, and returns how
// many methods it has.
func count(parsed map[string]*ast.File, typ string) int {
	fields := -1
	byFile := map[string][2]int{} // exported, unexported
	{
		for name, f := range parsed {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.GenDecl:
					for _, s := range d.Specs {
						if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.Name == typ {
							if st, ok := ts.Type.(*ast.StructType); ok {
								fields = 0
								for _, fl := range st.Fields.List {
									fields += max(len(fl.Names), 1) // an embedded field has no name
								}
							}
						}
					}
				case *ast.FuncDecl:
					if d.Recv == nil || len(d.Recv.List) == 0 || recvType(d.Recv.List[0].Type) != typ {
						continue
					}
					n := byFile[filepath.Base(name)]
					if ast.IsExported(d.Name.Name) {
						n[0]++
					} else {
						n[1]++
					}
					byFile[filepath.Base(name)] = n
				}
			}
		}
	}
	files := make([]string, 0, len(byFile))
	for f := range byFile {
		files = append(files, f)
	}
	slices.Sort(files)
	var exp, unexp int
	for _, f := range files {
		n := byFile[f]
		fmt.Printf("%-20s %3d methods (%d exported)\n", f, n[0]+n[1], n[0])
		exp, unexp = exp+n[0], unexp+n[1]
	}
	fmt.Printf("%s: %d fields; %d methods (%d exported, %d unexported) over %d files\n", typ, fields, exp+unexp, exp, unexp, len(files))
	return exp + unexp

}

// recvType returns the name of a receiver's base type: T of T, *T, T[P],
// *T[P, Q].
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
