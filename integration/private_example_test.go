package integration_test

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/berthq/berth/integration"
)

// A test that restarts its own PostgreSQL mid-run: the shared server other
// tests use is never touched.
func ExampleStartPostgres() {
	_ = func(t *testing.T) {
		pg := integration.StartPostgres(t) // skipped without initdb; failed under CI=true
		_ = pg.DSN                         // connect the code under test here
		pg.Restart(t, integration.PostgresImmediate)
	}
}

// A RabbitMQ node of its own, stopped and started again with its data.
func ExampleStartRabbitMQ() {
	_ = func(t *testing.T) {
		node := integration.StartRabbitMQ(t)
		_ = node.URL
		node.Stop(t)
		node.Start(t)
	}
}

// A proxy in front of a server adds latency, then holds the server's
// answers (a lost confirm) until Thaw.
func ExampleNewProxy() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() { // an echo server
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	p, err := integration.NewProxy(ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	p.SetLatency(10 * time.Millisecond)
	c, _ := net.Dial("tcp", p.Addr())
	defer c.Close()
	_, _ = c.Write([]byte("hello"))
	buf := make([]byte, 5)
	_, _ = io.ReadFull(c, buf)
	fmt.Println(string(buf))

	p.FreezeReplies()
	_, _ = c.Write([]byte("again"))
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err = io.ReadFull(c, buf)
	fmt.Println("answer held:", err != nil)
	p.Thaw()
	_ = c.SetReadDeadline(time.Time{})
	_, _ = io.ReadFull(c, buf)
	fmt.Println(string(buf))
	// Output:
	// hello
	// answer held: true
	// again
}
