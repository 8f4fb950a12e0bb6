package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// module is the import path whose functions a walk lists.
const module = "github.com/packcache/packcache"

// An entry is one traced function entry: its goroutine, the function,
// the file it is in, and its caller (frame 1 of the stack dlv printed).
type entry struct {
	g      int
	fn     string
	file   string
	caller string
}

var (
	ansiRE  = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	enterRE = regexp.MustCompile(`^> goroutine\((\d+)\): `)
	frameRE = regexp.MustCompile(`^\s+(\d+)\s+0x[0-9a-f]+ in (.*)$`)
	atRE    = regexp.MustCompile(`^\s+at (.*):\d+$`)
	shapeRE = regexp.MustCompile(`\[go\.shape[^\]]*(\[[^\]]*\][^\]]*)*\]`)
)

// countTrace reads the output of dlv trace --stack 2 (see the package
// comment) and prints each marked call's walk and its counts.
//
// A walk lists, in the order they ran, the functions of the module the
// call entered: on the caller's goroutine, and on the goroutines the call
// handed work to (internal/life's Go, which runs a shared read or a load
// on a goroutine parked after earlier work). It leaves out, as
// docs/walks.md's method does: the module's functions that the standard
// library or go-redis calls back into (a Budget's context methods, the
// dial hook, a writer the JSON encoder writes to, Unwrap from errors.Is),
// which are those whose caller is not the module's; the codec package,
// which is public; and goroutines of the cache's own that the call does
// not wait for (the breaker's budget timers, the owed-invalidation
// retrier), which are named at the end.
func countTrace(path string, check bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var entries []entry
	var cur *entry
	frame := -1
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := ansiRE.ReplaceAllString(sc.Text(), "")
		if m := enterRE.FindStringSubmatch(l); m != nil {
			var g int
			fmt.Sscan(m[1], &g)
			entries = append(entries, entry{g: g})
			cur, frame = &entries[len(entries)-1], -1
			continue
		}
		if strings.HasPrefix(l, ">>") {
			cur = nil // a return: its stack is not read
			continue
		}
		if cur == nil {
			continue
		}
		if m := frameRE.FindStringSubmatch(l); m != nil {
			fmt.Sscan(m[1], &frame)
			switch frame {
			case 0:
				if cur.fn == "" {
					cur.fn = m[2]
				}
			case 1:
				if cur.caller == "" {
					cur.caller = m[2]
				}
			}
			continue
		}
		if m := atRE.FindStringSubmatch(l); m != nil && frame == 0 && cur.file == "" {
			cur.file = m[1]
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	root := repoRoot(entries)
	var walks []walk
	for i := 0; i < len(entries); i++ {
		e := entries[i]
		if e.fn != "main.mark" {
			continue
		}
		j := i + 1
		for j < len(entries) && entries[j].fn != "main.mark" {
			j++
		}
		walks = append(walks, printWalk(callName(i, entries), entries[i+1:j], e.g, root))
		i = j
	}
	if !check {
		return nil
	}
	if len(walks) != 4 {
		return fmt.Errorf("%d calls marked in the trace, not 4: did the program fail?", len(walks))
	}
	if m := walks[0]; len(m.rootFiles) > 5 || m.rootChanges > 12 {
		return fmt.Errorf("the miss runs through %d root files (%s) with %d changes of file among them: issue 23 allows at most 5 and 12",
			len(m.rootFiles), strings.Join(m.rootFiles, ", "), m.rootChanges)
	}
	fmt.Printf("check: the miss runs through %d root files with %d changes of file among them (at most 5 and 12)\n", len(walks[0].rootFiles), walks[0].rootChanges)
	return nil
}

// A walk is what printWalk counted of one call.
type walk struct {
	rootFiles   []string
	rootChanges int
}

// callName is the name of the call that begins at entry i, a mark: the
// calls are made in a fixed order, each between two marks.
func callName(i int, entries []entry) string {
	n := 0
	for k := 0; k < i; k++ {
		if entries[k].fn == "main.mark" {
			n++
		}
	}
	return []string{"miss", "near hit", "Serve of a near hit", "failed Delete"}[min(n/2, 3)]
}

// repoRoot is the directory of the module's root package, from the
// files of its functions.
func repoRoot(entries []entry) string {
	for _, e := range entries {
		if strings.HasPrefix(e.fn, module+".") && filepath.Base(e.file) == "cache.go" {
			return filepath.Dir(e.file)
		}
	}
	return ""
}

func ours(fn string) bool {
	if !strings.HasPrefix(fn, module) {
		return false
	}
	rest := fn[len(module):]
	return !strings.HasPrefix(rest, "/codec.") && !strings.HasPrefix(rest, "/bench")
}

func printWalk(name string, es []entry, caller int, root string) walk {
	walked := map[int]bool{caller: true}
	callback := map[int]map[string]bool{} // by goroutine: functions called back, whose callees are too
	var others []string
	var lines []entry
	for _, e := range es {
		if !walked[e.g] {
			if e.caller == "runtime.goexit" && !background(e.fn) {
				walked[e.g] = true // work the call handed to a goroutine of its own
			} else {
				if ours(e.fn) && !slices.ContainsFunc(others, func(o string) bool { return strings.HasPrefix(o, fmt.Sprintf("goroutine %d:", e.g)) }) {
					others = append(others, fmt.Sprintf("goroutine %d: %s", e.g, short(e.fn)))
				}
				continue
			}
		}
		if callback[e.g] == nil {
			callback[e.g] = map[string]bool{}
		}
		if callback[e.g][e.caller] || ours(e.fn) && !ours(e.caller) && !fromRuntime(e.caller) && !strings.HasPrefix(e.caller, "main.") {
			// Called back by the standard library or go-redis, or by such
			// a function in turn.
			callback[e.g][e.fn] = true
			continue
		}
		if !ours(e.fn) || e.file == "<autogenerated>" {
			continue // not the module's, or a wrapper the compiler made
		}
		lines = append(lines, e)
	}
	var files, rootFiles []string
	changes, rootChanges := 0, 0
	gs := map[int]bool{}
	prev, prevRoot := "", ""
	fmt.Printf("#### %s\n\n```\n", name)
	for n, e := range lines {
		file, _ := filepath.Rel(root, e.file)
		mark := " "
		if prev != "" && file != prev {
			mark = "*"
			changes++
		}
		prev = file
		if !slices.Contains(files, file) {
			files = append(files, file)
		}
		if !strings.Contains(file, "/") {
			if prevRoot != "" && file != prevRoot {
				rootChanges++
			}
			prevRoot = file
			if !slices.Contains(rootFiles, file) {
				rootFiles = append(rootFiles, file)
			}
		}
		gs[e.g] = true
		fmt.Printf("%3d%s G%d %s: %s\n", n+1, mark, e.g, file, short(e.fn))
	}
	fmt.Printf("```\n\n%d hops, %d files (%d root: %s), %d changes of file (%d root-only), %d goroutine(s).\n",
		len(lines), len(files), len(rootFiles), strings.Join(rootFiles, ", "), changes, rootChanges, len(gs))
	if len(others) > 0 {
		fmt.Printf("Not walked (the call does not wait for them): %s.\n", strings.Join(others, "; "))
	}
	fmt.Println()
	return walk{rootFiles, rootChanges}
}

// short is fn without the module's path and with generic shapes as [...].
func short(fn string) string {
	fn = shapeRE.ReplaceAllString(fn, "[…]")
	fn = strings.ReplaceAll(fn, module+"/", "")
	return strings.TrimPrefix(fn, module+".")
}

// fromRuntime reports a caller that is the runtime running the module's
// own code: a goroutine's start, or a deferred call.
func fromRuntime(caller string) bool {
	switch caller {
	case "runtime.goexit", "runtime.deferreturn", "runtime.gopanic", "runtime.Goexit":
		return true
	}
	return false
}

// background reports the first function of a goroutine the cache starts
// for itself, which a call does not wait for: the owed-invalidation
// retrier, the breaker's budget timers, a load's lease keeper (a timer),
// the near cache's invalidation stream.
func background(fn string) bool {
	for _, p := range []string{"/internal/owed.", "/internal/breaker.(*ticks)", "/internal/breaker.(*tick)", ".(*keeper).extend", "/internal/tracking."} {
		if strings.Contains(fn, module+p) || strings.HasPrefix(p, ".") && strings.Contains(fn, p) {
			return true
		}
	}
	return false
}
