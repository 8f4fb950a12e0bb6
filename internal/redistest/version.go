package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// ServerEnv is the environment variable that names the server binary every
// helper of this package starts (single nodes, Cluster nodes, replicas and
// Sentinels alike): a path, or a name looked up on PATH, of a redis-server
// or of a compatible server such as valkey-server. Unset or empty, it is
// redis-server on PATH. A server named by it must exist: setting it implies
// PACKCACHE_REQUIRE_REDIS=1, so a wrong path fails the tests rather than
// running them on the miniredis fallback.
const ServerEnv = "PACKCACHE_REDIS_SERVER"

// serverWanted returns the binary the helpers look for: $PACKCACHE_REDIS_SERVER,
// else serverBinary.
func serverWanted() string {
	if v := os.Getenv(ServerEnv); v != "" {
		return v
	}
	return serverBinary
}

// serverMissing says, for a test's message, which server was looked for
// and not found.
func serverMissing() string {
	if v := os.Getenv(ServerEnv); v != "" {
		return fmt.Sprintf("%s=%s is not an executable", ServerEnv, v)
	}
	return serverBinary + " not found on PATH"
}

// requiredMissing says, for a failed test, which server was looked for and
// not found, and why the miniredis fallback may not stand in.
func requiredMissing() string {
	if os.Getenv(ServerEnv) != "" {
		return serverMissing() + " (a server that " + ServerEnv + " names must exist: no fallback)"
	}
	return serverMissing() + " and " + RequireEnv + "=1"
}

// ServerPath returns the path of the server binary the helpers start
// (see ServerEnv), or "" if there is none and the miniredis fallback
// stands in.
func ServerPath() string { return findServer() }

// Version is the name and version of the server the helpers start, as its
// binary's --version reports them.
type Version struct {
	// Name is "redis" or "valkey" (the first word of --version, in lower
	// case), "miniredis" for the fallback, or "unknown" if the binary's
	// --version could not be read (Raw then says why).
	Name                string
	Major, Minor, Patch int
	// Path is the binary's path; empty for the fallback.
	Path string
	// Raw is the first line of --version's output, or why it is missing.
	Raw string
}

// String returns, for example, "valkey 8.0.1".
func (v Version) String() string {
	if v.Name == "miniredis" || v.Name == "unknown" {
		return v.Name
	}
	return fmt.Sprintf("%s %d.%d.%d", v.Name, v.Major, v.Minor, v.Patch)
}

// AtLeast reports whether v is the named server ("redis" or "valkey") at
// version major.minor.patch or later.
func (v Version) AtLeast(name string, major, minor, patch int) bool {
	if v.Name != name {
		return false
	}
	a, b := [3]int{v.Major, v.Minor, v.Patch}, [3]int{major, minor, patch}
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

// versionLine matches the first line of redis-server --version and
// valkey-server --version: "Redis server v=7.0.15 sha=...",
// "Valkey server v=8.0.1 sha=...".
var versionLine = regexp.MustCompile(`^(\S+) server v=(\d+)\.(\d+)\.(\d+)`)

var versions struct {
	mu sync.Mutex
	m  map[string]Version // by binary path
}

// ServerVersion returns the name and version of the server binary the
// helpers start (see ServerEnv), so that a test can name a difference
// between servers. It runs the binary with --version once per binary and
// test process. For the miniredis fallback its Name is "miniredis".
func ServerVersion() Version {
	bin := findServer()
	if bin == "" {
		return Version{Name: "miniredis", Raw: serverMissing()}
	}
	versions.mu.Lock()
	defer versions.mu.Unlock()
	if v, ok := versions.m[bin]; ok {
		return v
	}
	v := readVersion(bin)
	if versions.m == nil {
		versions.m = map[string]Version{}
	}
	versions.m[bin] = v
	return v
}

func readVersion(bin string) Version {
	v := Version{Name: "unknown", Path: bin}
	out, err := exec.Command(bin, "--version").Output()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	v.Raw = line
	if err != nil {
		v.Raw = fmt.Sprintf("%s --version: %v", bin, err)
		return v
	}
	return parseVersion(v, line)
}

// parseVersion fills v's Name and numbers from line, the first line of
// --version, and leaves v as it is if line is not of that form.
func parseVersion(v Version, line string) Version {
	m := versionLine.FindStringSubmatch(line)
	if m == nil {
		return v
	}
	v.Name = strings.ToLower(m[1])
	v.Major, _ = strconv.Atoi(m[2])
	v.Minor, _ = strconv.Atoi(m[3])
	v.Patch, _ = strconv.Atoi(m[4])
	return v
}

// CLIPath returns the command-line client that goes with the server the
// helpers start: valkey-cli or redis-cli in the server binary's directory
// (as in a build tree), else on PATH. It returns "" if there is none.
// Either client speaks to either server; the matching one is preferred
// only so that a machine with one server installed needs nothing else.
func CLIPath() string {
	names := []string{"redis-cli", "valkey-cli"}
	if ServerVersion().Name == "valkey" {
		names = []string{"valkey-cli", "redis-cli"}
	}
	if bin := findServer(); bin != "" {
		for _, n := range names {
			p := filepath.Join(filepath.Dir(bin), n)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				return p
			}
		}
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

var tlsProbe struct {
	mu sync.Mutex
	m  map[string][2]string // by binary path: {"yes" or "", why not}
}

// ServerHasTLS reports whether the server binary the helpers start was
// built with TLS (Debian's redis-server is; the matrix's builds from
// source are not), and if not, why, in a sentence for t.Skip. The answer
// is kept per binary.
//
// Asking the binary to parse a tls-port directive, as a probe of Redis
// 7.0 could, no longer tells: in Redis 7.4 and Valkey 8.0 the TLS
// directives parse in every build, and a build without TLS fails only
// when it sets up its listeners ("Failed finding TLS support."). So the
// probe starts the binary with TLS replication on, no port and no
// certificate: a build with TLS exits at once for want of a certificate
// ("Failed to configure TLS"), one without for want of TLS, and one of
// Redis 7.0 without TLS refuses the directive. It binds no port and
// writes nothing but its log to stdout.
func ServerHasTLS() (bool, string) {
	bin := findServer()
	if bin == "" {
		return false, serverMissing()
	}
	tlsProbe.mu.Lock()
	defer tlsProbe.mu.Unlock()
	if r, ok := tlsProbe.m[bin]; ok {
		return r[0] == "yes", r[1]
	}
	ok, why := probeTLS(bin)
	if tlsProbe.m == nil {
		tlsProbe.m = map[string][2]string{}
	}
	r := [2]string{"", why}
	if ok {
		r[0] = "yes"
	}
	tlsProbe.m[bin] = r
	return ok, why
}

func probeTLS(bin string) (bool, string) {
	dir, err := os.MkdirTemp("", "redistest-tlsprobe-*")
	if err != nil {
		return false, fmt.Sprintf("could not tell whether %s has TLS: %v", bin, err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--port", "0", "--save", "", "--appendonly", "no", "--dir", dir,
		"--tls-replication", "yes",
		"--tls-cert-file", filepath.Join(dir, "none.pem"), "--tls-key-file", filepath.Join(dir, "none.key"))
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	switch s := string(out); {
	case strings.Contains(s, "Failed to configure TLS"):
		return true, ""
	case strings.Contains(s, "Failed finding TLS support"),
		strings.Contains(s, "Bad directive") && strings.Contains(s, "tls-"):
		return false, fmt.Sprintf("%s (%s) was built without TLS", bin, ServerVersion())
	default:
		return false, fmt.Sprintf("could not tell whether %s has TLS: %s", bin, lastLine(s))
	}
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
