package life

import "testing"

// TestLife: Close is idle once the calls and goroutines under way have
// exited; after it, Enter and TrySpawn refuse and Spawn (for work already
// registered) is still counted.
func TestLife(t *testing.T) {
	var l Life
	l.Init()
	if !l.Enter() || !l.TrySpawn() {
		t.Fatal("Enter or TrySpawn refused before Close")
	}
	idle := l.Close()
	if l.Enter() || l.TrySpawn() {
		t.Fatal("Enter or TrySpawn accepted after Close began")
	}
	l.Spawn() // by the call still under way
	if n := l.Running(); n != 3 {
		t.Fatalf("Running = %d, want 3", n)
	}
	for i := 0; i < 3; i++ {
		select {
		case <-idle:
			t.Fatalf("idle with %d under way", 3-i)
		default:
		}
		l.Exit()
	}
	<-idle
	if again := l.Close(); again != idle {
		t.Fatal("a second Close returned another channel")
	}
}

// TestLifeCloseIdle: Close with nothing under way is idle at once.
func TestLifeCloseIdle(t *testing.T) {
	var l Life
	l.Init()
	if !l.Enter() {
		t.Fatal("Enter refused")
	}
	l.Exit()
	<-l.Close()
}
