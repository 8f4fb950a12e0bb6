package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// connFlags are the global flags that say which Redis to talk to.
type connFlags struct {
	addrs          []string
	url            string
	cluster        bool
	sentinelMaster string
	sentinelUser   string
	sentinelPass   string
	user           string
	password       string
	db             int
	tls            bool
	cacert         string
	cert           string
	key            string
	insecure       bool
	timeout        time.Duration
	maxValueSize   int
}

// defaultAddr is the server the commands that only read use when nothing
// names one. It is a variable only so that tests can point it at a server
// of their own.
var defaultAddr = "127.0.0.1:6379"

// The environment variables that name the server when no flag does: the
// address (several, joined by commas, for cluster seeds or Sentinels, as
// --addr repeated), or a URL, as --url.
const (
	envAddr = "PACKCACHE_ADDR"
	envURL  = "PACKCACHE_URL"
)

// server fills in the addresses or URL from the environment when no flag
// gives any, and says where the server comes from: "flags", the variable,
// or "" when nothing names one and defaultAddr applies.
func (f *connFlags) server() (string, error) {
	if len(f.addrs) > 0 || f.url != "" {
		return "flags", nil
	}
	u, a := strings.TrimSpace(os.Getenv(envURL)), strings.TrimSpace(os.Getenv(envAddr))
	switch {
	case u != "" && a != "":
		return "", usagef("$%s and $%s are both set: unset one, or name the server with --addr or --url", envAddr, envURL)
	case u != "":
		f.url = u
		return "$" + envURL, nil
	case a != "":
		for _, s := range strings.Split(a, ",") {
			if s = strings.TrimSpace(s); s != "" {
				f.addrs = append(f.addrs, s)
			}
		}
		return "$" + envAddr, nil
	}
	return "", nil
}

// defaultMaxValueSize is the decoded-size limit, the same as the library's
// (64 << 20).
const defaultMaxValueSize = 64 << 20

func (f *connFlags) register(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.StringArrayVar(&f.addrs, "addr", nil, "Redis `host:port` (repeatable): the server, the cluster seeds with --cluster, or the sentinels with --sentinel-master (default $"+envAddr+", joined by commas; without it or --url, inspect, stats and advise read "+defaultAddr+", and recompress and advise --publish refuse to run)")
	fs.StringVar(&f.url, "url", "", "Redis `URL`, redis://[user:password@]host:port[/db][?options] or rediss:// for TLS (go-redis ParseURL; ParseClusterURL with --cluster, ParseFailoverURL with --sentinel-master) (default $"+envURL+")")
	fs.BoolVar(&f.cluster, "cluster", false, "the addresses are seeds of a Redis Cluster; every master is scanned")
	fs.StringVar(&f.sentinelMaster, "sentinel-master", "", "connect to the master the Sentinels at --addr know as `NAME`")
	fs.StringVar(&f.sentinelUser, "sentinel-user", "", "ACL user for the Sentinels")
	fs.StringVar(&f.sentinelPass, "sentinel-password", "", "password for the Sentinels")
	fs.StringVar(&f.user, "user", "", "ACL user")
	fs.StringVar(&f.password, "password", "", "password (default $REDISCLI_AUTH)")
	fs.IntVar(&f.db, "db", 0, "database number (not with --cluster)")
	fs.BoolVar(&f.tls, "tls", false, "connect with TLS")
	fs.StringVar(&f.cacert, "cacert", "", "PEM `file` of CA certificates to verify the server with (implies --tls)")
	fs.StringVar(&f.cert, "cert", "", "PEM client certificate `file` (implies --tls; needs --key)")
	fs.StringVar(&f.key, "key", "", "PEM client private key `file` (implies --tls; needs --cert)")
	fs.BoolVar(&f.insecure, "insecure-skip-verify", false, "do not verify the server's certificate (implies --tls)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "dial timeout, and read and write timeout of each command")
	fs.IntVar(&f.maxValueSize, "max-value-size", defaultMaxValueSize, "largest decoded value in bytes; larger values are reported as too large (FORMAT.md section 4)")
}

// conn is a connection to one Redis deployment.
type conn struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // set for a Redis Cluster
	limit   int                  // decoded-size limit
	dicts   dictionaries         // the zstd dictionaries values named, fetched (dict.go)
}

func (c *conn) Close() error { return c.rdb.Close() }

// connect checks the flags, connects and pings. Flag mistakes are usage
// errors; a Redis that does not answer is not.
//
// writer names what is about to write ("recompress", "advise --publish"),
// or is "" for a command that only reads. A command that writes must be
// told its server (a flag or the environment); one that only reads falls
// back to defaultAddr, and says so on stderr.
func (f *connFlags) connect(ctx context.Context, writer string, stderr io.Writer) (*conn, error) {
	from, err := f.server()
	if err != nil {
		return nil, err
	}
	if from == "" && writer != "" {
		return nil, usagef("%s writes, so it needs its server named: --addr host:port (with --cluster, the seeds), --url, $%s or $%s; it never falls back to %s", writer, envAddr, envURL, defaultAddr)
	}
	if f.maxValueSize <= 0 {
		return nil, usagef("--max-value-size must be positive, not %d", f.maxValueSize)
	}
	if f.timeout <= 0 {
		return nil, usagef("--timeout must be positive, not %v", f.timeout)
	}
	if f.url != "" && len(f.addrs) > 0 {
		return nil, usagef("give either --url or --addr, not both")
	}
	if f.cluster && f.sentinelMaster != "" {
		return nil, usagef("--cluster and --sentinel-master exclude each other")
	}
	if f.cluster && f.db != 0 {
		return nil, usagef("a Redis Cluster has only database 0; drop --db")
	}
	if (f.cert == "") != (f.key == "") {
		return nil, usagef("--cert and --key go together")
	}
	password := f.password
	if password == "" {
		password = os.Getenv("REDISCLI_AUTH")
	}
	tlsConf, err := f.tlsConfig()
	if err != nil {
		return nil, err
	}
	// Which server, when no flag said: the default, or the environment's.
	var note string
	switch from {
	case "":
		note = fmt.Sprintf("packcache: reading %s, the default: no --addr, --url, $%s or $%s names a server\n", defaultAddr, envAddr, envURL)
	case "$" + envAddr:
		note = fmt.Sprintf("packcache: server from $%s: %s\n", envAddr, strings.Join(f.addrs, ", "))
	case "$" + envURL:
		note = fmt.Sprintf("packcache: server from $%s\n", envURL) // the URL may hold a password
	}
	c := &conn{limit: f.maxValueSize}
	switch {
	case f.cluster:
		o := &redis.ClusterOptions{Addrs: f.addrs}
		if f.url != "" {
			if o, err = redis.ParseClusterURL(f.url); err != nil {
				return nil, usagef("--url: %v", err)
			}
		}
		if len(o.Addrs) == 0 {
			o.Addrs = []string{defaultAddr}
		}
		f.set(clientFields{&o.Username, &o.Password, nil, &o.TLSConfig, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.ContextTimeoutEnabled, &o.ClientName}, password, tlsConf)
		c.cluster = redis.NewClusterClient(o)
		c.rdb = c.cluster
	case f.sentinelMaster != "":
		o := &redis.FailoverOptions{SentinelAddrs: f.addrs}
		if f.url != "" {
			if o, err = redis.ParseFailoverURL(f.url); err != nil {
				return nil, usagef("--url: %v", err)
			}
		}
		o.MasterName = f.sentinelMaster
		if len(o.SentinelAddrs) == 0 {
			return nil, usagef("--sentinel-master needs the Sentinels' addresses: --addr host:26379")
		}
		setAuth(&o.SentinelUsername, &o.SentinelPassword, f.sentinelUser, f.sentinelPass)
		f.set(clientFields{&o.Username, &o.Password, &o.DB, &o.TLSConfig, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.ContextTimeoutEnabled, &o.ClientName}, password, tlsConf)
		c.rdb = redis.NewFailoverClient(o)
	default:
		if len(f.addrs) > 1 {
			return nil, usagef("%d addresses given: add --cluster to use them as cluster seeds, or --sentinel-master NAME to use them as Sentinels", len(f.addrs))
		}
		o := &redis.Options{Addr: defaultAddr}
		if len(f.addrs) == 1 {
			o.Addr = f.addrs[0]
		}
		if f.url != "" {
			if o, err = redis.ParseURL(f.url); err != nil {
				return nil, usagef("--url: %v", err)
			}
		}
		f.set(clientFields{&o.Username, &o.Password, &o.DB, &o.TLSConfig, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.ContextTimeoutEnabled, &o.ClientName}, password, tlsConf)
		c.rdb = redis.NewClient(o)
	}
	io.WriteString(stderr, note)
	if err := c.check(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// clientFields points at the fields of one kind of go-redis options
// (redis.Options, redis.ClusterOptions or redis.FailoverOptions) that the
// flags set alike for every kind.
type clientFields struct {
	user, password    *string
	db                *int // nil for a cluster, which has only database 0
	tls               **tls.Config
	dial, read, write *time.Duration
	contextTimeout    *bool
	name              *string
}

// set sets the fields from the flags, over what a URL said: the user, the
// password (password, the flag's or $REDISCLI_AUTH) and the database where
// the flags give them, the TLS settings tlsConf laid over the URL's, and
// the timeouts; and it enables the context's deadlines and names the
// client, as for every client of this command.
func (f *connFlags) set(c clientFields, password string, tlsConf *tls.Config) {
	setAuth(c.user, c.password, f.user, password)
	if c.db != nil && f.db != 0 {
		*c.db = f.db
	}
	*c.tls = mergeTLS(*c.tls, tlsConf)
	*c.dial, *c.read, *c.write = f.timeout, f.timeout, f.timeout
	*c.contextTimeout = true
	*c.name = "packcache-cli"
}

// setAuth sets user and password where the flags give them, keeping what a
// URL said otherwise.
func setAuth(user, password *string, flagUser, flagPassword string) {
	if flagUser != "" {
		*user = flagUser
	}
	if flagPassword != "" {
		*password = flagPassword
	}
}

// tlsConfig builds the TLS settings the flags ask for, or nil for none.
func (f *connFlags) tlsConfig() (*tls.Config, error) {
	if !f.tls && f.cacert == "" && f.cert == "" && !f.insecure {
		return nil, nil
	}
	// ServerName stays empty: go-redis dials with tls.DialWithDialer,
	// which takes it from each address, so cluster nodes verify too.
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.insecure}
	if f.cacert != "" {
		pem, err := os.ReadFile(f.cacert)
		if err != nil {
			return nil, usagef("--cacert: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--cacert: no PEM certificate in %s", f.cacert)
		}
		conf.RootCAs = pool
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, usagef("--cert/--key: %v", err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

// mergeTLS lays the flags' TLS settings over a URL's (rediss://).
func mergeTLS(fromURL, fromFlags *tls.Config) *tls.Config {
	switch {
	case fromFlags == nil:
		return fromURL
	case fromURL == nil:
		return fromFlags
	}
	fromFlags.ServerName = fromURL.ServerName
	return fromFlags
}

// check pings, and refuses a cluster node reached as a single server: a
// SCAN there would see a third of the keys and every other read would be
// redirected.
func (c *conn) check(ctx context.Context) error {
	if err := c.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("cannot reach Redis: %w", err)
	}
	if c.cluster != nil {
		return nil
	}
	info, err := c.rdb.Info(ctx, "cluster").Result()
	if err == nil && strings.Contains(info, "cluster_enabled:1") {
		return usagef("%s is a Redis Cluster node: add --cluster", c.rdb.(*redis.Client).Options().Addr)
	}
	return nil
}

// masterFunc works on one master. name identifies it in cursors and
// messages.
type masterFunc func(ctx context.Context, node *redis.Client, name string) error

// eachMaster calls fn for every master: the one server, the Sentinels'
// master, or concurrently every master of a cluster.
func (c *conn) eachMaster(ctx context.Context, fn masterFunc) error {
	if c.cluster == nil {
		node := c.rdb.(*redis.Client)
		return fn(ctx, node, "")
	}
	return c.cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return fn(ctx, node, node.Options().Addr)
	})
}

// masterNames lists the cluster's masters, sorted; nil for other
// deployments.
func (c *conn) masterNames(ctx context.Context) ([]string, error) {
	if c.cluster == nil {
		return nil, nil
	}
	// Reload the slot map: the masters named in a saved cursor are
	// compared with the cluster as it is now.
	c.cluster.ReloadState(ctx)
	var mu sync.Mutex
	var names []string
	err := c.cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		mu.Lock()
		names = append(names, node.Options().Addr)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// isWrongType reports a command used on a key of another type.
func isWrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}
