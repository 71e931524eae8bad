package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthq/berth/brokers/jetstream"
	"github.com/berthq/berth/sdk"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// A private PostgreSQL keeps its data across a fast and an immediate
// restart, and refuses connections while it is down.
func TestPrivatePostgresRestarts(t *testing.T) {
	pg := StartPostgres(t)
	ctx := context.Background()
	exec := func(sql string) error {
		c, err := pgx.Connect(ctx, pg.DSN)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec(`CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{PostgresFast, PostgresImmediate} {
		pg.Stop(t, mode)
		if err := exec(`SELECT 1`); err == nil {
			t.Fatalf("%s: a stopped server answered", mode)
		}
		pg.Start(t)
		if err := exec(`INSERT INTO kept VALUES (2)`); err != nil {
			t.Fatalf("after %s restart: %v", mode, err)
		}
	}
	c, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM kept`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("rows after two restarts: %d, %v; want 3", n, err)
	}
}

// A private Redis is its own: FLUSHALL there leaves the shared one alone,
// and a restarted one is empty.
func TestPrivateRedis(t *testing.T) {
	r := StartRedis(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if r.Addr == RedisAddr(t) {
		t.Fatal("the private Redis is the shared one")
	}
	r.Stop(t)
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("a stopped Redis answered")
	}
	r.Start(t)
	if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("after a restart: %v, want an empty Redis", err)
	}
}

// A private Redis Cluster node listens on two ports, its own and its
// cluster bus's, and both must be free ports below the kernel's ephemeral
// range, as freePort picks them. Redis's default bus port is the port +
// 10000: for close to half the ports freePort gives it fell in the ephemeral
// range, and nobody checked it was free, so the node failed to start
// whenever an outgoing connection or another private server held it (and
// for a port above 55535 Redis refuses to start at all).
func TestPrivateRedisClusterBusPort(t *testing.T) {
	low := ephemeralLow()
	// Six nodes: with the bus at the port + 10000, at least one of them
	// would get a bus port in the ephemeral range but about once in 30 runs.
	// In parallel: a node takes two seconds to declare its cluster up.
	for i := range 6 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			s := StartRedisCluster(t)
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
			defer rdb.Close()
			nodes, err := rdb.ClusterNodes(context.Background()).Result()
			if err != nil {
				t.Fatal(err)
			}
			bus := -1
			for _, line := range strings.Split(nodes, "\n") {
				f := strings.Fields(line)
				if len(f) < 3 || !strings.Contains(f[2], "myself") {
					continue
				}
				// <id> <ip>:<port>@<bus port>[,<hostname>] myself,master ...
				_, b, ok := strings.Cut(f[1], "@")
				b, _, _ = strings.Cut(b, ",")
				if n, err := strconv.Atoi(b); ok && err == nil {
					bus = n
				}
			}
			if bus < 0 {
				t.Fatalf("no bus port in CLUSTER NODES:\n%s", nodes)
			}
			if bus >= low || bus < 10000 {
				t.Fatalf("node %s: cluster bus port %d, want one below the ephemeral range (%d) and not under 10000", s.Addr, bus, low)
			}
			if err := rdb.Set(context.Background(), "k", "v", 0).Err(); err != nil {
				t.Fatalf("the cluster node refused a write: %v", err)
			}
		})
	}
}

// A private RabbitMQ node listens on its own port, not the system
// config's, and keeps a durable queue's messages across a stop and start.
func TestPrivateRabbitMQRestarts(t *testing.T) {
	node := StartRabbitMQ(t)
	if node.Port == 5672 {
		t.Fatal("the private node took the system port")
	}
	publish := func() {
		conn, err := amqp.Dial(node.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("kept", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		dc, err := ch.PublishWithDeferredConfirm("", "kept", false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("confirm: %v %v", ok, err)
		}
	}
	publish()
	node.Stop(t)
	if _, err := amqp.Dial(node.URL); err == nil {
		t.Fatal("a stopped node accepted a connection")
	}
	node.Start(t)
	conn, err := amqp.Dial(node.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive("kept", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 1 {
		t.Fatalf("%d messages after a restart, want the confirmed one", q.Messages)
	}
}

// A private nats-server keeps its JetStream streams across a clean stop and
// a SIGKILL, refuses connections while it is down, and is not the shared one.
func TestPrivateNATSRestarts(t *testing.T) {
	srv := StartNATS(t)
	if srv.URL == NATSURL(t) {
		t.Fatal("the private NATS is the shared one")
	}
	ctx := context.Background()
	depth := func() int64 {
		t.Helper()
		b, err := jetstream.Connect(ctx, srv.URL, jetstream.ConnectOptions{Name: "berth-private-test"}, jetstream.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		st, err := b.Stats(ctx, "kept")
		if err != nil {
			t.Fatal(err)
		}
		return st.Ready
	}
	b, err := jetstream.Connect(ctx, srv.URL, jetstream.ConnectOptions{Name: "berth-private-test"}, jetstream.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Publish(ctx, "kept", &sdk.Message{Type: "t", Body: []byte("x")})
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, stop := range []func(testing.TB){srv.Stop, srv.Kill} {
		stop(t)
		if c, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.URL, "nats://"), time.Second); err == nil {
			c.Close()
			t.Fatal("a stopped server accepted a connection")
		}
		srv.Start(t)
		if n := depth(); n != 1 {
			t.Fatalf("%d messages ready after a restart, want the acknowledged one", n)
		}
	}
}

// echoServer answers every byte back; it stops when the test ends.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() { _, _ = io.Copy(c, c) }() // ends when the conn is closed above
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg []byte) error {
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("garbled")
	}
	return nil
}

func TestProxyFaults(t *testing.T) {
	p := StartProxy(t, echoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, []byte("hello")); err != nil {
		t.Fatal(err)
	}

	// Latency: a round trip crosses the proxy twice.
	p.SetLatency(100 * time.Millisecond)
	start := time.Now()
	if err := roundTrip(c, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("round trip took %v with 100ms latency each way", d)
	}
	p.SetLatency(0)

	// Freeze: the connection stays open and silent; Thaw delivers.
	p.Freeze()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 4)
	var ne net.Error
	if _, err := io.ReadFull(c, buf); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read through a frozen proxy: %v, want a timeout", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	p.Thaw()
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after Thaw: %q %v", buf, err)
	}

	// FreezeReplies: the request reaches the server, its answer is held.
	p.FreezeReplies()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := io.ReadFull(c, buf); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read with replies frozen: %v, want a timeout", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	p.Thaw()
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("after Thaw: %q %v", buf, err)
	}

	// Reset: the client's connection breaks; a new one works.
	p.Reset()
	if err := roundTrip(c, []byte("after reset")); err == nil {
		t.Fatal("a reset connection still worked")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := roundTrip(c2, []byte("new")); err != nil {
		t.Fatal(err)
	}

	// Refuse: new connections are closed at once.
	p.Refuse(true)
	c3, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c3.Close()
		if err := roundTrip(c3, []byte("x")); err == nil {
			t.Fatal("a refused connection worked")
		}
	}
}

// freePort never hands out the same port twice in one process: two private
// servers started in parallel could get the same port (or one's port was
// the other's cluster bus port), about once in 350 runs of the twelve picks
// of TestPrivateRedisClusterBusPort, and one of them failed to start.
func TestFreePortNotHandedOutTwice(t *testing.T) {
	// Enough picks that two equal ones are all but certain if nothing
	// prevents it (about 20 expected from 1000 random ports of 22768).
	n := min(1000, (ephemeralLow()-10000)/10)
	seen := make(map[int]bool, n)
	for range n {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("freePort handed out port %d twice", p)
		}
		seen[p] = true
	}
}

// A port freePort gave can be taken before the server binds it, by a
// server of another test process (freePort keeps a port apart only in its
// own): a private Redis Cluster node whose port or cluster bus port is so
// taken starts on other ports. Before, its start failed: on the bus port
// the node exited ("Address already in use"), and on its own port the
// client talked to the other listener, which closed the connection (as a
// cluster bus does): "CLUSTER ADDSLOTSRANGE: ... connection reset".
func TestPrivateRedisClusterPortTaken(t *testing.T) {
	for _, which := range []string{"port", "bus"} {
		t.Run(which, func(t *testing.T) {
			t.Parallel()
			s := newRedisServer(t)
			if s == nil {
				return
			}
			var err error
			if s.busPort, err = freePort(); err != nil {
				t.Fatal(err)
			}
			taken := map[string]int{"port": s.port, "bus": s.busPort}[which]
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(taken))
			if err != nil {
				t.Skipf("port %d: %v", taken, err)
			}
			done := make(chan struct{})
			t.Cleanup(func() { ln.Close(); <-done })
			go func() {
				defer close(done)
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			s.startCluster(t)
			if s.port == taken || s.busPort == taken {
				t.Fatalf("the node kept the taken port %d (port %d, bus %d)", taken, s.port, s.busPort)
			}
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
			defer rdb.Close()
			if err := rdb.Set(context.Background(), "k", "v", 0).Err(); err != nil {
				t.Fatalf("the cluster node refused a write: %v", err)
			}
		})
	}
}
