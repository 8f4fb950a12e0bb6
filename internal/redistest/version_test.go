package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseVersion(t *testing.T) {
	for _, c := range []struct {
		line string
		want string
	}{
		{"Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=1b9ddb3a4bc31a18", "redis 7.0.15"},
		{"Redis server v=7.4.1 sha=00000000:1 malloc=libc bits=64 build=5d5b2b4e4b9b1f2a", "redis 7.4.1"},
		{"Valkey server v=8.0.1 sha=00000000:1 malloc=libc bits=64 build=d48c7f740adba2df", "valkey 8.0.1"},
		{"something else", "unknown"},
	} {
		if got := parseVersion(Version{Name: "unknown"}, c.line).String(); got != c.want {
			t.Errorf("parseVersion(%q) = %s, want %s", c.line, got, c.want)
		}
	}
	v := Version{Name: "redis", Major: 7, Minor: 4, Patch: 1}
	for _, c := range []struct {
		name          string
		maj, min, pat int
		want          bool
	}{
		{"redis", 7, 4, 1, true},
		{"redis", 7, 4, 2, false},
		{"redis", 7, 2, 9, true},
		{"redis", 8, 0, 0, false},
		{"valkey", 7, 0, 0, false},
	} {
		if got := v.AtLeast(c.name, c.maj, c.min, c.pat); got != c.want {
			t.Errorf("%s AtLeast(%s %d.%d.%d) = %v, want %v", v, c.name, c.maj, c.min, c.pat, got, c.want)
		}
	}
}

// TestServerEnv: PACKCACHE_REDIS_SERVER chooses the binary every helper
// starts, and one that is not there fails the test (never the miniredis
// fallback), even without PACKCACHE_REQUIRE_REDIS=1.
func TestServerEnv(t *testing.T) {
	real := findServer()
	t.Setenv(RequireEnv, "")
	t.Setenv(ServerEnv, "/nonexistent/valkey-server")
	if p := ServerPath(); p != "" {
		t.Fatalf("ServerPath with %s naming no file = %q", ServerEnv, p)
	}
	if v := ServerVersion(); v.Name != "miniredis" {
		t.Fatalf("ServerVersion with no server = %+v", v)
	}
	for name, f := range map[string]func(tb testing.TB){
		"Start":          func(tb testing.TB) { Start(tb) },
		"StartCluster":   func(tb testing.TB) { StartCluster(tb, 3) },
		"RequireServer":  func(tb testing.TB) { RequireServer(tb, "this check") },
		"ReplicaCluster": func(tb testing.TB) { StartClusterWithReplicas(tb, 3, 1) },
	} {
		r := runTB(t, f)
		if r.fatal == "" || r.skipped != "" || !strings.Contains(r.fatal, ServerEnv+"=/nonexistent/valkey-server") {
			t.Errorf("%s with %s naming no file: fatal=%q skipped=%q, want a failure naming it", name, ServerEnv, r.fatal, r.skipped)
		}
	}
	if real == "" {
		return
	}
	t.Setenv(ServerEnv, real)
	if p := ServerPath(); p != real {
		t.Fatalf("ServerPath = %q, want %q", p, real)
	}
	s := Start(t)
	info, err := s.admin.doString(adminTimeout, "INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Readlink("/proc/" + parseInfo(info)["process_id"] + "/exe")
	if err != nil {
		t.Skipf("cannot tell the started binary: %v", err)
	}
	want, err := filepath.EvalSymlinks(real)
	if err != nil {
		t.Fatal(err)
	}
	if exe != want {
		t.Fatalf("Start ran %s, want %s (%s)", exe, real, want)
	}
}

// TestServerVersionMatchesInfo: ServerVersion agrees with what a started
// server says of itself in INFO server, and names the differences in that
// section between servers.
func TestServerVersionMatchesInfo(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	v := ServerVersion()
	t.Logf("server: %s (%s)", v, v.Path)
	s := Start(t)
	info, err := s.admin.doString(adminTimeout, "INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	kv := parseInfo(info)
	num := strings.TrimPrefix(v.String(), v.Name+" ")
	switch v.Name {
	case "redis":
		if kv["redis_version"] != num || kv["redis_mode"] != "standalone" {
			t.Fatalf("%s: INFO server says redis_version:%s redis_mode:%s", v, kv["redis_version"], kv["redis_mode"])
		}
	case "valkey":
		// Valkey names itself in server_name and valkey_version, and
		// reports a fixed redis_version (7.2.4 in Valkey 8.0) for clients
		// that compare it: a client that gates a feature on
		// redis_version sees 7.2.4 whatever Valkey's version. It also
		// renames redis_mode to server_mode (unless
		// extended-redis-compatibility is on).
		if kv["server_name"] != "valkey" || kv["valkey_version"] != num {
			t.Fatalf("%s: INFO server says server_name:%s valkey_version:%s", v, kv["server_name"], kv["valkey_version"])
		}
		if v.AtLeast("valkey", 8, 0, 0) && kv["redis_version"] != "7.2.4" {
			t.Errorf("%s: redis_version:%s, want the fixed 7.2.4 that Valkey 8 reports", v, kv["redis_version"])
		}
		if _, ok := kv["redis_mode"]; ok || kv["server_mode"] != "standalone" {
			t.Errorf("%s: redis_mode:%q server_mode:%q, want server_mode:standalone and no redis_mode", v, kv["redis_mode"], kv["server_mode"])
		}
	default:
		t.Fatalf("unknown server %+v", v)
	}
}

// TestServerHasTLS: the probe tells a build with TLS from one without, and
// agrees with what a server started with a TLS port does.
func TestServerHasTLS(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	ok, why := ServerHasTLS()
	t.Logf("%s: TLS %v %s", ServerVersion(), ok, why)
	if !ok && !strings.Contains(why, "without TLS") {
		t.Fatalf("the probe could not tell: %s", why)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	cert, key := writeSelfSigned(t, dir)
	r := runTB(t, func(tb testing.TB) {
		Start(tb, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", cert, "--tls-key-file", key, "--tls-auth-clients", "no")
	})
	if started := r.fatal == ""; started != ok {
		t.Fatalf("ServerHasTLS = %v, but a server with a TLS port: started %v (%s)", ok, started, r.fatal)
	}
}

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 and its
// key to dir and returns their paths.
func writeSelfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestRepliesThatDiffer names replies whose code is the same on every
// server but whose rest differs, so that code matching more than the code
// (packcache matches error replies by their first word only) would break
// on one of them: HELLO's server field, and the text of NOSCRIPT.
func TestRepliesThatDiffer(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	v := ServerVersion()
	s := Start(t)
	hello, err := s.admin.do(adminTimeout, "HELLO", "2")
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]any{}
	if a, ok := hello.([]any); ok {
		for i := 0; i+1 < len(a); i += 2 {
			if k, ok := a[i].(string); ok {
				fields[k] = a[i+1]
			}
		}
	}
	num := strings.TrimPrefix(v.String(), v.Name+" ")
	if fields["server"] != v.Name || fields["version"] != num {
		t.Errorf("%s: HELLO says server %v, version %v", v, fields["server"], fields["version"])
	}
	_, err = s.admin.do(adminTimeout, "EVALSHA", strings.Repeat("0", 40), "0")
	want := map[string]string{
		"redis":  "NOSCRIPT No matching script. Please use EVAL.",
		"valkey": "NOSCRIPT No matching script.", // Valkey 8.0 dropped the advice
	}[v.Name]
	if err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT ") {
		t.Fatalf("%s: EVALSHA of an unknown script: %v, want a NOSCRIPT reply", v, err)
	}
	if err.Error() != want {
		t.Errorf("%s: EVALSHA of an unknown script: %q, want %q", v, err, want)
	}
}

// TestWaitCoversOtherConnections names a difference in WAIT: on Redis
// 7.0, WAIT sent on a connection that wrote nothing waits until the
// replicas have what the master had when WAIT came (writes made on other
// connections included); on Redis 7.4 and Valkey 8.0 it waits only for
// that connection's own writes, so it returns at once, with the number of
// replicas online. A test that makes its writes through one client and
// WAITs on another proves nothing on the later servers: it should use
// Cluster.WaitReplicated, or WAIT on the connection that wrote.
func TestWaitCoversOtherConnections(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	v := ServerVersion()
	m := Start(t, "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(m.Addr())
	r := Start(t, "--replicaof", host, port)
	ctx := ctxT(t, time.Minute)
	// On the writer's own connection, WAIT returns once the replica is
	// online and has the write, on every server.
	w := m.Client(t).Conn()
	t.Cleanup(func() { w.Close() })
	if err := w.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := w.Do(ctx, "WAIT", 1, 1000).Int()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica did not acknowledge the write within 30 s")
		}
	}
	r.Pause(t)
	defer r.Resume(t)
	if err := w.Set(ctx, "k", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The replica is paused: it cannot have the second write.
	n, err := m.Client(t).Do(ctx, "WAIT", 1, 300).Int()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: WAIT 1 on a new connection, after a write on another that the (paused) replica lacks: %d", v, n)
	switch {
	case v.Name == "redis" && v.Major == 7 && v.Minor == 0:
		if n != 0 {
			t.Errorf("%s: WAIT on a new connection = %d, want 0: it covers other connections' writes", v, n)
		}
	case v.AtLeast("redis", 7, 4, 0) || v.AtLeast("valkey", 8, 0, 0):
		if n != 1 {
			t.Errorf("%s: WAIT on a new connection = %d, want 1 at once: it covers only its own connection's writes", v, n)
		}
	}
}

// TestCLIPath: the client CLIPath gives talks to the server the helpers
// start, and is the one built beside it when there is one.
func TestCLIPath(t *testing.T) {
	t.Parallel() // servers of its own; after the serial tests, which count processes
	haveRedisServer(t)
	cli := CLIPath()
	if cli == "" {
		t.Skip("no valkey-cli or redis-cli beside the server or on PATH")
	}
	v := ServerVersion()
	if v.Name == "valkey" || v.Name == "redis" {
		beside := filepath.Join(filepath.Dir(v.Path), v.Name+"-cli")
		if _, err := os.Stat(beside); err == nil && cli != beside {
			t.Errorf("CLIPath = %s, want %s, beside the server", cli, beside)
		}
	}
	s := Start(t)
	_, port, _ := net.SplitHostPort(s.Addr())
	out, err := exec.Command(cli, "-h", "127.0.0.1", "-p", port, "PING").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "PONG" {
		t.Fatalf("%s PING: %q, %v", cli, out, err)
	}
}
