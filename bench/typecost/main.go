// Command typecost measures what each distinct T of Cache[T] costs a
// program that uses it: issue 23's figures for binary size and for the
// compile of the main package, one type against twelve.
//
//	cd bench && go run ./typecost
//
// It writes two throwaway programs into a temporary directory inside the
// bench module (so that go.work resolves packcache to this working tree):
// one that uses Cache[T] (New, Set, Get, GetMany, GetOrLoad, Close) for one
// struct type, one that does the same for twelve distinct struct types of
// different shapes (as real document types are: nested slices, maps,
// pointers, arrays, time.Time). The first type of both is the same; the
// programs differ only in the eleven more types and their calls.
//
// What is measured, and how:
//
//   - Both programs are built once first, to warm the build cache: the
//     standard library, go-redis and packcache's own packages are then
//     cache hits, and are the same for both programs: packcache compiles
//     once whatever T is. The cache is go env GOCACHE; with -fresh-cache
//     it is a temporary directory of its own instead (the warm-up then
//     compiles the standard library too: minutes on a busy machine).
//     Either way the main package's compile is measured alone: it starts
//     after its dependencies are done and ends before the link starts.
//   - Before each measured build a nonce is written into the program's
//     main package, so that the main package, and only it, is compiled
//     again, and the binary linked again. A generic type's instantiations
//     (Cache[Channel] and every method and function it reaches) are
//     compiled in the package that instantiates them, the main package,
//     so the main package's compile is where each T's cost shows.
//   - go build runs with -toolexec pointing at this command, which runs
//     each tool as a child and records its wall time, CPU time (user+sys)
//     and peak RSS (rusage ru_maxrss). The compile of the main package
//     (-p main) and the link are reported; so is the whole go build (wall,
//     and the peak RSS of its process tree).
//   - The two builds run alternately, -rounds times, the first of each
//     round alternating (1,12 then 12,1 ...), and the medians are
//     reported with the 12/1 ratios. The machine's load average is
//     printed with each build: on a shared machine only the ratios of
//     builds run side by side mean much, and CPU time is steadier than
//     wall time.
//
// The binary size is the size of go build's output with default flags
// (symbols and DWARF included), as a service would build it.
//
// The library packages' own compiles, from the warm-up, are printed once
// as well: they do not depend on T, so they are paid once per build.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// logEnv names the file a toolexec child appends its records to; when it
// is set, this command is running as go build's -toolexec.
const logEnv = "TYPECOST_TOOLEXEC_LOG"

func main() {
	if path := os.Getenv(logEnv); path != "" {
		os.Exit(toolexec(path, os.Args[1:]))
	}
	rounds := flag.Int("rounds", 3, "alternations of the two builds")
	keep := flag.Bool("keep", false, "keep the generated programs (and a fresh GOCACHE); their paths are printed")
	fresh := flag.Bool("fresh-cache", false, "build with a GOCACHE of its own, empty at the start, instead of go env GOCACHE")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *rounds, *keep, *fresh); err != nil {
		fmt.Fprintln(os.Stderr, "typecost:", err)
		os.Exit(1)
	}
}

// A record is one tool run, as the toolexec child saw it.
type record struct {
	Tool   string  `json:"tool"` // "compile", "link", ...
	Pkg    string  `json:"pkg"`  // the -p argument of a compile; TOOLEXEC_IMPORTPATH otherwise
	Wall   float64 `json:"wall"` // seconds
	CPU    float64 `json:"cpu"`  // seconds, user+sys
	MaxRSS int64   `json:"maxrss"`
}

// toolexec runs args (a tool and its arguments) as go build asked and
// appends a record of it to path; it returns the tool's exit code.
func toolexec(path string, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "typecost: toolexec without a tool")
		return 2
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if cmd.ProcessState == nil {
		fmt.Fprintln(os.Stderr, "typecost:", err)
		return 1
	}
	tool := strings.TrimSuffix(filepath.Base(args[0]), ".exe")
	version := slices.ContainsFunc(args[1:], func(a string) bool { return strings.HasPrefix(a, "-V") })
	if (tool == "compile" || tool == "link") && !version {
		pkg := os.Getenv("TOOLEXEC_IMPORTPATH")
		if i := slices.Index(args, "-p"); tool == "compile" && i >= 0 && i+1 < len(args) {
			pkg = args[i+1]
		}
		cpu, rss := usage(cmd.ProcessState)
		line, _ := json.Marshal(record{Tool: tool, Pkg: pkg, Wall: wall.Seconds(), CPU: cpu, MaxRSS: rss})
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			// One write of one short line with O_APPEND: the compiles go
			// build runs at once do not interleave within a line.
			f.Write(append(line, '\n'))
			f.Close()
		}
	}
	return cmd.ProcessState.ExitCode()
}

// usage returns the CPU seconds (user+sys) and the peak RSS in bytes of a
// finished process (and of the children it waited for).
func usage(ps *os.ProcessState) (cpu float64, rss int64) {
	cpu = (ps.UserTime() + ps.SystemTime()).Seconds()
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		rss = int64(ru.Maxrss) * 1024 // kilobytes on Linux
	}
	return cpu, rss
}

// A build is one measured go build of one program.
type build struct {
	types   int
	size    int64
	wall    float64 // the whole go build
	rss     int64   // peak RSS of go build's process tree
	compile record  // the main package's compile
	link    record
	load    string // /proc/loadavg before the build
}

func run(ctx context.Context, rounds int, keep, fresh bool) error {
	bench, err := benchDir()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(bench, "typecost-tmp-")
	if err != nil {
		return err
	}
	gocache := goenv("GOCACHE")
	if fresh {
		if gocache, err = os.MkdirTemp("", "typecost-gocache-"); err != nil {
			os.RemoveAll(dir)
			return err
		}
		if !keep {
			defer os.RemoveAll(gocache)
		}
	}
	if keep {
		fmt.Printf("programs: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	fmt.Printf("GOCACHE:  %s\n", gocache)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	m := &measurer{bench: bench, dir: dir, gocache: gocache, self: self, log: filepath.Join(dir, "toolexec.log")}

	version, _ := exec.Command("go", "version").Output()
	fmt.Printf("typecost: %s", version)
	fmt.Printf("GOFLAGS=%q GOMAXPROCS=%s, %d rounds\n", goenv("GOFLAGS"), orDefault(os.Getenv("GOMAXPROCS"), "(default)"), rounds)

	programs := []int{1, len(docTypes)}
	for _, n := range programs {
		if err := m.write(n); err != nil {
			return err
		}
	}
	// Warm-up: everything but the main packages into the private GOCACHE.
	var lib []record
	for _, n := range programs {
		b, recs, err := m.build(ctx, n)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.Tool == "compile" && strings.HasPrefix(r.Pkg, "github.com/packcache/packcache") && r.Pkg != "main" {
				lib = append(lib, r)
			}
		}
		fmt.Printf("warm-up  %2d type(s): go build %.1f s\n", n, b.wall)
	}
	if len(lib) > 0 {
		fmt.Println("\nlibrary packages compiled in the warm-up (once, whatever T):")
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "package\twall s\tcpu s\tpeak RSS MB\t")
		for _, r := range lib {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.0f\t\n", r.Pkg, r.Wall, r.CPU, mb(r.MaxRSS))
		}
		tw.Flush()
	}

	fmt.Println("\nmeasured builds (main package compiled again, everything else cached):")
	// Printed as each build ends, in fixed columns: a tabwriter would
	// hold the lines back until the last.
	const row = "%5v %5v %9v %14v %7v %11v %7v %11v %10v %12v  %s\n"
	fmt.Printf(row, "round", "types", "binary MB", "main compile s", "cpu s", "peak RSS MB", "link s", "link RSS MB", "go build s", "build RSS MB", "load avg (1 5 15 min)")
	var all []build
	for i := range rounds {
		order := programs
		if i%2 == 1 {
			order = []int{programs[1], programs[0]}
		}
		for _, n := range order {
			b, _, err := m.build(ctx, n)
			if err != nil {
				return err
			}
			all = append(all, b)
			fmt.Printf(row, i+1, n, f2(float64(b.size)/1e6), f2(b.compile.Wall), f2(b.compile.CPU), f0(mb(b.compile.MaxRSS)),
				f2(b.link.Wall), f0(mb(b.link.MaxRSS)), f2(b.wall), f0(mb(b.rss)), b.load)
		}
	}
	report(all, programs)
	return nil
}

// report prints the medians of each program's builds and the ratios.
func report(all []build, programs []int) {
	type med struct{ size, wall, cpu, rss, link, linkRSS, build, buildRSS float64 }
	meds := map[int]med{}
	for _, n := range programs {
		var bs []build
		for _, b := range all {
			if b.types == n {
				bs = append(bs, b)
			}
		}
		f := func(get func(build) float64) float64 {
			xs := make([]float64, len(bs))
			for i, b := range bs {
				xs[i] = get(b)
			}
			return median(xs)
		}
		meds[n] = med{
			size:     f(func(b build) float64 { return float64(b.size) / 1e6 }),
			wall:     f(func(b build) float64 { return b.compile.Wall }),
			cpu:      f(func(b build) float64 { return b.compile.CPU }),
			rss:      f(func(b build) float64 { return mb(b.compile.MaxRSS) }),
			link:     f(func(b build) float64 { return b.link.Wall }),
			linkRSS:  f(func(b build) float64 { return mb(b.link.MaxRSS) }),
			build:    f(func(b build) float64 { return b.wall }),
			buildRSS: f(func(b build) float64 { return mb(b.rss) }),
		}
	}
	one, many := meds[programs[0]], meds[programs[1]]
	fmt.Printf("\nmedians of %d builds each (MB = 10^6 bytes):\n", len(all)/2)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\t1 type\t%d types\t%d/1\ttarget\t\n", programs[1], programs[1])
	fmt.Fprintf(tw, "binary MB\t%.2f\t%.2f\t+%.2f MB (%.2fx)\t<= +2.5 MB\t\n", one.size, many.size, many.size-one.size, many.size/one.size)
	fmt.Fprintf(tw, "main compile wall s\t%.2f\t%.2f\t%.2fx\t<= 1.5x\t\n", one.wall, many.wall, many.wall/one.wall)
	fmt.Fprintf(tw, "main compile cpu s\t%.2f\t%.2f\t%.2fx\t\t\n", one.cpu, many.cpu, many.cpu/one.cpu)
	fmt.Fprintf(tw, "main compile peak RSS MB\t%.0f\t%.0f\t%.2fx\t<= 1.5x\t\n", one.rss, many.rss, many.rss/one.rss)
	fmt.Fprintf(tw, "link wall s\t%.2f\t%.2f\t%.2fx\t\t\n", one.link, many.link, many.link/one.link)
	fmt.Fprintf(tw, "link peak RSS MB\t%.0f\t%.0f\t%.2fx\t\t\n", one.linkRSS, many.linkRSS, many.linkRSS/one.linkRSS)
	fmt.Fprintf(tw, "go build wall s\t%.2f\t%.2f\t%.2fx\t\t\n", one.build, many.build, many.build/one.build)
	fmt.Fprintf(tw, "go build peak RSS MB\t%.0f\t%.0f\t%.2fx\t\t\n", one.buildRSS, many.buildRSS, many.buildRSS/one.buildRSS)
	tw.Flush()
}

type measurer struct {
	bench, dir, gocache, self, log string
}

func (m *measurer) pkgDir(n int) string { return filepath.Join(m.dir, fmt.Sprintf("types%d", n)) }

// write generates the program of the first n document types.
func (m *measurer) write(n int) error {
	d := m.pkgDir(n)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d, "main.go"), program(docTypes[:n]), 0o644)
}

// build builds program n after changing its nonce, and returns what it
// measured and every tool record of the build.
func (m *measurer) build(ctx context.Context, n int) (build, []record, error) {
	b := build{types: n, load: loadavg()}
	nonce := make([]byte, 8)
	rand.Read(nonce)
	src := fmt.Sprintf("package main\n\n// nonce makes this package's compile a cache miss.\nconst nonce = %q\n", hex.EncodeToString(nonce))
	if err := os.WriteFile(filepath.Join(m.pkgDir(n), "nonce.go"), []byte(src), 0o644); err != nil {
		return b, nil, err
	}
	if err := os.Remove(m.log); err != nil && !errors.Is(err, os.ErrNotExist) {
		return b, nil, err
	}
	out := filepath.Join(m.dir, fmt.Sprintf("types%d.bin", n))
	rel, err := filepath.Rel(m.bench, m.pkgDir(n))
	if err != nil {
		return b, nil, err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-toolexec", m.self, "-o", out, "./"+filepath.ToSlash(rel))
	cmd.Dir = m.bench
	cmd.Env = append(os.Environ(), "GOCACHE="+m.gocache, logEnv+"="+m.log)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return b, nil, fmt.Errorf("go build of the %d-type program: %v\n%s", n, err, stderr.Bytes())
	}
	b.wall = time.Since(start).Seconds()
	_, b.rss = usage(cmd.ProcessState)
	fi, err := os.Stat(out)
	if err != nil {
		return b, nil, err
	}
	b.size = fi.Size()
	recs, err := readLog(m.log)
	if err != nil {
		return b, nil, err
	}
	for _, r := range recs {
		switch {
		case r.Tool == "compile" && r.Pkg == "main":
			b.compile = r
		case r.Tool == "link":
			b.link = r
		}
	}
	if b.compile.Tool == "" {
		return b, recs, fmt.Errorf("the %d-type program's main package was not compiled (a cache hit?)", n)
	}
	return b, recs, nil
}

func readLog(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var recs []record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		recs = append(recs, r)
	}
	return recs, sc.Err()
}

// benchDir returns the bench module's directory: the working directory
// or a parent of it that holds its go.mod.
func benchDir() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	data, err := os.ReadFile(gomod)
	if err != nil || !bytes.Contains(data, []byte("module github.com/packcache/packcache/bench\n")) {
		return "", fmt.Errorf("run typecost from the bench module (cd bench && go run ./typecost); go env GOMOD is %q", gomod)
	}
	return filepath.Dir(gomod), nil
}

func goenv(key string) string {
	out, _ := exec.Command("go", "env", key).Output()
	return strings.TrimSpace(string(out))
}

func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func mb(b int64) float64 { return float64(b) / 1e6 }

func f2(x float64) string { return fmt.Sprintf("%.2f", x) }
func f0(x float64) string { return fmt.Sprintf("%.0f", x) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}
