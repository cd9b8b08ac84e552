package logcapture

import (
	"fmt"
	"sync"
	"testing"
)

// Lines written by a logger and by plain writers on several goroutines,
// while another goroutine reads them, all arrive whole and are counted.
// Without the lock the writers' appends race each other and the reader:
// go test -race fails here (without -race the loss is not reliably seen).
func TestLogsReadWhileWritten(t *testing.T) {
	logger, logs := New()
	const writers, perWriter = 4, 500
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case <-stop:
				return
			default:
				logs.Count("\n")
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				if w%2 == 0 {
					logger.Info("tick", "writer", w, "i", i)
				} else {
					fmt.Fprintf(logs, "raw writer=%d i=%d\n", w, i)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-readerDone
	if n := logs.Count("\n"); n != writers*perWriter {
		t.Fatalf("%d lines, want %d", n, writers*perWriter)
	}
	for w := range writers {
		prefix := "raw "
		if w%2 == 0 {
			prefix = `level=INFO msg=tick `
		}
		if n := logs.Count(fmt.Sprintf("%swriter=%d i=%d\n", prefix, w, perWriter-1)); n != 1 {
			t.Errorf("writer %d's last line found %d times, want once", w, n)
		}
		if n := logs.Count(fmt.Sprintf("writer=%d ", w)); n != perWriter {
			t.Errorf("writer %d: %d lines, want %d", w, n, perWriter)
		}
	}
}
