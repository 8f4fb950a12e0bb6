package packcache_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The README is a front page: what packcache is, a quick start that
// compiles, the API, one line per guarantee. These tests keep it so. They
// need no Redis.

// readmeMaxBytes is the README's budget; the rest belongs in docs/.
const readmeMaxBytes = 15 * 1024

func TestReadmeSize(t *testing.T) {
	fi, err := os.Stat("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > readmeMaxBytes {
		t.Errorf("README.md is %d bytes, over its budget of %d: move detail to a page in docs/ and link it", fi.Size(), readmeMaxBytes)
	}
}

// TestReadmeLinks checks every relative link in README.md, FORMAT.md and
// docs/*.md: the file it names exists, and an #anchor names a heading of
// that file (by GitHub's rules for heading ids).
func TestReadmeLinks(t *testing.T) {
	files := []string{"README.md", "FORMAT.md"}
	docs, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, docs...)
	anchors := map[string]map[string]bool{} // by cleaned path
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := markdownAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	checked := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(b)) {
			dest := l.dest
			if isExternal(dest) {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(dest, "#")
			target := file
			if path != "" {
				target = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s:%d: link %q: %s does not exist", file, l.line, dest, target)
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				t.Errorf("%s:%d: link %q: an anchor in a file that is not markdown", file, l.line, dest)
				continue
			}
			a, err := anchorsOf(filepath.Clean(target))
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", file, l.line, dest, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading with the id %q", file, l.line, dest, target, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link parser is broken")
	}
}

// TestReadmeQuickStartBuilds extracts the README's quick start (its first
// go block with "package main") and vets it, as a program of a module of
// its own that requires this working tree, offline: it compiles as it
// stands, imports and all.
func TestReadmeQuickStartBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program with the go command; skipped under -short")
	}
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src := quickStart(string(readme))
	if src == "" {
		t.Fatal("README.md has no ```go block with package main: the quick start must be a complete program")
	}
	root, err := os.Getwd() // go test runs a package's tests in its directory: the module root
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	// The library's own go.mod, renamed, requiring the library from this
	// tree: every version the program can need is one the library already
	// resolved, so the module cache a build of the library warmed has them.
	mod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(string(gomod),
		"module example.com/readmequickstart")
	mod += fmt.Sprintf("\nrequire github.com/packcache/packcache v0.0.0\n\nreplace github.com/packcache/packcache => %s\n", root)

	dir := t.TempDir()
	for name, data := range map[string][]byte{
		"go.mod":  []byte(mod),
		"go.sum":  gosum,
		"main.go": []byte(src),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), gobin, "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GOWORK=off",        // not this checkout's go.work: the program is a module of its own
		"GOFLAGS=-mod=mod",  // go.mod may gain the program's direct requirements
		"GOPROXY=off",       // offline: the module cache has what the library's build needed
		"GOSUMDB=off",       // nothing to verify online; go.sum is the library's
		"GOTOOLCHAIN=local", // this go, never a download
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's quick start does not build (go vet in %s): %v\n%s\n--- main.go:\n%s", dir, err, out, numbered(src))
	}
}

// quickStart returns the first ```go block of md that declares package
// main, or "".
func quickStart(md string) string {
	for _, b := range fencedBlocks(md) {
		if b.lang == "go" && regexp.MustCompile(`(?m)^package main\s*$`).MatchString(b.body) {
			return b.body
		}
	}
	return ""
}

type fenced struct {
	lang, body string
}

// fencedBlocks returns md's fenced code blocks (``` or ~~~).
func fencedBlocks(md string) []fenced {
	var blocks []fenced
	var cur *fenced
	var fence string
	var body strings.Builder
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == nil {
			if f := fenceOf(trimmed); f != "" {
				fence = f
				cur = &fenced{lang: strings.TrimSpace(strings.TrimLeft(trimmed, f[:1]))}
				body.Reset()
			}
			continue
		}
		if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
			cur.body = body.String()
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	return blocks
}

// fenceOf returns the fence a line opens (``` or ~~~, three or more), or "".
func fenceOf(line string) string {
	for _, c := range []string{"`", "~"} {
		n := len(line) - len(strings.TrimLeft(line, c))
		if n >= 3 {
			return line[:n]
		}
	}
	return ""
}

// outsideFences calls f with each line of md outside fenced code blocks,
// numbered from 1.
func outsideFences(md string, f func(n int, line string)) {
	var fence string
	for i, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if fence = fenceOf(trimmed); fence != "" {
			continue
		}
		f(i+1, line)
	}
}

type mdLink struct {
	line int
	dest string
}

var (
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
)

// markdownLinks returns the destinations of md's inline links and images
// and of its link reference definitions, outside code.
func markdownLinks(md string) []mdLink {
	var links []mdLink
	outsideFences(md, func(n int, line string) {
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			links = append(links, mdLink{n, m[1]})
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			links = append(links, mdLink{n, m[1]})
		}
	})
	return links
}

func isExternal(dest string) bool {
	return regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`).MatchString(dest) || strings.HasPrefix(dest, "//")
}

var (
	atxHeading = regexp.MustCompile(`^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	linkText   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// markdownAnchors returns the ids GitHub gives md's headings: the
// heading's text lowercased, punctuation dropped (but '-' and '_'),
// spaces made '-'; a repeated id gets -1, -2, ... .
func markdownAnchors(md string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	outsideFences(md, func(_ int, line string) {
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			return
		}
		id := slug(m[1])
		if n := seen[id]; n > 0 {
			seen[id] = n + 1
			id = fmt.Sprintf("%s-%d", id, n)
		} else {
			seen[id] = 1
		}
		ids[id] = true
	})
	return ids
}

func slug(heading string) string {
	text := linkText.ReplaceAllString(heading, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func numbered(src string) string {
	var b bytes.Buffer
	for i, line := range strings.Split(strings.TrimSuffix(src, "\n"), "\n") {
		fmt.Fprintf(&b, "%3d  %s\n", i+1, line)
	}
	return b.String()
}
