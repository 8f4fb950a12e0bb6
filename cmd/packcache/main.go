// Command packcache looks at and maintains the values packcache stores in
// Redis: it inspects single keys, reports what a key prefix holds, advises
// a codec, level and compression threshold from measurements of the
// prefix's own values, and rewrites a prefix's values under a new policy.
//
// Usage:
//
//	packcache [connection flags] inspect KEY...
//	packcache [connection flags] stats [--prefix P]... [--sample N]
//	packcache [connection flags] advise --prefix P [--sample N] [--chart FILE.svg]
//	                                 [--train [--dict-size N] [--dictionary-out FILE] [--publish]]
//	packcache [connection flags] recompress --prefix P --codec NAME [--level L] [--compress-above N]
//	                                     [--dictionary FILE | --dictionary-id ID]
//	                                     [--dry-run] [--rate N/s] [--cursor C]
//	packcache [connection flags] invalidate --group NAME...
//
// inspect, stats and advise only read, but for advise --train --publish,
// which stores the dictionary it trained. recompress writes, and only with
// a compare-and-set that leaves alone any value that changed after it was
// read. invalidate invalidates groups of values (FORMAT.md section 2.4).
// The three that write need the server named (--addr, --url,
// $PACKCACHE_ADDR or $PACKCACHE_URL); the others default to
// 127.0.0.1:6379 and say so. Values written with a zstd dictionary are read with the dictionary
// Redis holds for them (FORMAT.md section 3.6). docs/packcache.md at the root of the repository has examples with
// real output.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1   // a runtime failure: Redis, a missing key, a prefix with no keys
	exitUsage       = 2   // bad flags or arguments; nothing was attempted
	exitInterrupted = 130 // stopped by a signal (or a cancelled context); see the printed cursor
)

func main() {
	// go-redis logs failed dials itself; the command reports every error
	// once, with its cause.
	redis.SetLogger(quietLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// usageError is bad input the user can fix by changing the command line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// errInterrupted ends a command that stopped because its context ended;
// the command has already said where to resume.
var errInterrupted = errors.New("interrupted")

// run is the whole command: it parses args, runs the subcommand, prints
// errors to stderr and returns the exit code. It keeps no state between
// calls, so tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var ranCommand bool
	root := newRootCmd(stdout, stderr, &ranCommand)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	cmd, _, _ := root.Find(args)
	if cmd == nil {
		cmd = root
	}
	var ue usageError
	switch {
	case errors.Is(err, errInterrupted) || ctx.Err() != nil:
		fmt.Fprintln(stderr, "packcache: interrupted")
		return exitInterrupted
	case !ranCommand || errors.As(err, &ue):
		// Errors before a subcommand ran come from parsing: an unknown
		// command or flag, a missing argument.
		fmt.Fprintf(stderr, "packcache: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return exitUsage
	default:
		fmt.Fprintf(stderr, "packcache: %v\n", err)
		return exitFailure
	}
}

func newRootCmd(stdout, stderr io.Writer, ranCommand *bool) *cobra.Command {
	var cf connFlags
	root := &cobra.Command{
		Use:   "packcache",
		Short: "Inspect, measure and rewrite the values packcache stores in Redis",
		Long: `packcache inspects single keys, reports what a key prefix holds, advises a codec,
level and compression threshold from measurements of a prefix's own values, and
rewrites a prefix's values under a new policy.

Connection flags go before the subcommand:

  packcache --addr 10.0.0.5:6379 stats
  packcache --cluster --addr 10.0.0.1:7000 --addr 10.0.0.2:7000 stats --prefix channel:
  packcache --sentinel-master mymaster --addr 10.0.0.1:26379 inspect channel:42
  packcache --url rediss://user@redis.example:6380/0 --cacert ca.pem advise --prefix report:

The server is the one --addr or --url names or, without either, $PACKCACHE_ADDR
(host:port, several joined by commas) or $PACKCACHE_URL.

inspect, stats and advise only read (SCAN, GET, GETRANGE, STRLEN, PTTL, TYPE, INFO,
MEMORY USAGE); with no server named they read 127.0.0.1:6379 and say so on stderr.
Three commands write, and refuse to run until the server is named: recompress, through a
compare-and-set script (and, with --dictionary, the dictionary's key),
advise --train --publish, which stores the dictionary it trained under
packcache:dict:ID, and invalidate, which invalidates groups of values (one script on
the keys under {packcache:g}).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cf.register(root)
	root.AddCommand(
		newInspectCmd(&cf),
		newStatsCmd(&cf),
		newAdviseCmd(&cf),
		newRecompressCmd(&cf),
		newInvalidateCmd(&cf),
	)
	root.CompletionOptions.DisableDefaultCmd = true
	// A subcommand runs only once cobra has checked its flags and
	// arguments: what fails from then on is not a usage error unless it
	// says so.
	for _, c := range root.Commands() {
		f := c.RunE
		c.RunE = func(cmd *cobra.Command, args []string) error {
			*ranCommand = true
			return f(cmd, args)
		}
	}
	return root
}
