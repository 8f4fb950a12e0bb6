package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress is a progress bar on stderr, or nothing when progress is off.
// Its methods are safe for concurrent use (the bar locks) and do nothing on
// a nil *progress.
type progress struct {
	bar *progressbar.ProgressBar
}

// showProgress reports whether to draw progress: --progress, or stderr is a
// terminal.
func showProgress(flag bool, stderr io.Writer) bool {
	if flag {
		return true
	}
	f, ok := stderr.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newProgress draws a bar counting unit up to total, with an estimate of
// the time left, or a spinner with a count and rate when total is -1.
func newProgress(on bool, stderr io.Writer, total int64, desc, unit string) *progress {
	if !on {
		return nil
	}
	return &progress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(unit),
		progressbar.OptionSetPredictTime(total > 0),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish(),
	)}
}

func (p *progress) add(n int) {
	if p != nil {
		p.bar.Add(n)
	}
}

// clear takes the bar off the line so that a message can be printed; the
// next add draws it again.
func (p *progress) clear() {
	if p != nil {
		p.bar.Clear()
	}
}

func (p *progress) finish() {
	if p != nil {
		p.bar.Finish()
	}
}
