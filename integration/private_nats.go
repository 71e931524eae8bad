package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSServer is a private nats-server with JetStream a test owns, on a free
// loopback port, its file store in a temporary directory: a test may stop,
// kill and start it again on the same store without touching the shared
// NATS.
type NATSServer struct {
	// URL is nats://127.0.0.1:<port>.
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// Name is the server's server_name, as JetStream names the leaders and
	// replicas of a stream in a cluster (StartNATSCluster); "" for a
	// single server.
	Name string

	bin, dir string
	args     []string // the command line, less the binary
	server
}

// StartNATS starts a private nats-server with JetStream (well under a
// second) and waits until it accepts connections. It is stopped when the
// test ends. Without nats-server the test is skipped (failed under CI=true).
func StartNATS(t testing.TB) *NATSServer {
	t.Helper()
	bin, err := findBinary("nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server")
	if err != nil {
		missing(t, "NATS", err)
		return nil
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s := newNATSServer(t, bin, port, t.TempDir())
	s.Start(t)
	return s
}

// StartNATSCluster starts n private nats-servers with JetStream that form
// one cluster: each its own client and cluster ports, store directory and
// server_name, with routes to all the others. It waits until every node
// accepts connections and the JetStream meta group has a leader and knows
// every node (a stream with n replicas can be placed), so a test may
// create replicated streams at once. Each node may be stopped, killed and
// started again on its store like a single StartNATS server.
func StartNATSCluster(t testing.TB, n int) []*NATSServer {
	t.Helper()
	bin, err := findBinary("nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server")
	if err != nil {
		missing(t, "NATS", err)
		return nil
	}
	id := randomName("berth-")
	nodes := make([]*NATSServer, n)
	clusterPorts := make([]int, n)
	for i := range nodes {
		port, err1 := freePort()
		cport, err2 := freePort()
		if err1 != nil || err2 != nil {
			t.Fatalf("free port: %v %v", err1, err2)
		}
		nodes[i] = newNATSServer(t, bin, port, t.TempDir())
		nodes[i].Name = fmt.Sprintf("%s-%d", id, i)
		clusterPorts[i] = cport
	}
	for i, node := range nodes {
		var routes []string
		for j, cport := range clusterPorts {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", cport))
			}
		}
		node.args = append(node.args,
			"--server_name", node.Name,
			"--cluster_name", id,
			"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", clusterPorts[i]),
			"--routes", strings.Join(routes, ","),
		)
	}
	for _, node := range nodes {
		node.Start(t)
	}
	if err := waitJetStreamPlacement(nodes[0].URL, n, 30*time.Second); err != nil {
		t.Fatalf("nats cluster: %v\n%s", err, nodes[0].Log())
	}
	return nodes
}

// ClusterURL returns the client URLs of nodes, comma-separated, as
// nats.Connect takes a list of seed servers.
func ClusterURL(nodes []*NATSServer) string {
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.URL
	}
	return strings.Join(urls, ",")
}

// waitJetStreamPlacement waits until the server at url places a stream
// with the given replicas: in a cluster, once the meta group has elected a
// leader and knows that many peers. It creates and deletes a small stream
// to find out.
func waitJetStreamPlacement(url string, replicas int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	probe := strings.ToUpper(randomName("BERTH_PROBE_"))
	for {
		err := func() error {
			nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect())
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: probe, Subjects: []string{probe}, Storage: jetstream.MemoryStorage, Replicas: replicas}); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				return err
			}
			return js.DeleteStream(ctx, probe)
		}()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no stream with %d replicas placed at %s within %v: %w", replicas, url, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func newNATSServer(t testing.TB, bin string, port int, dir string) *NATSServer {
	s := &NATSServer{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), Port: port, bin: bin, dir: dir,
		args: []string{"-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", filepath.Join(dir, "store")}}
	t.Cleanup(func() {
		if p := s.current(); p != nil {
			p.stop(syscall.SIGKILL, 5*time.Second)
		}
	})
	return s
}

// Start starts the server (again, after Stop or Kill) on its store
// directory and waits until it accepts connections.
func (s *NATSServer) Start(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil && !p.exited() {
		t.Fatal("nats: already running")
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env = os.Environ()
	logPath := s.dir + "/nats.log"
	p, err := startProc(cmd, logPath)
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	s.set(p)
	if err := waitTCP(p, fmt.Sprintf("127.0.0.1:%d", s.Port), 30*time.Second); err != nil {
		p.stop(syscall.SIGKILL, 5*time.Second)
		t.Fatalf("nats: %v\n%s", err, tailFile(logPath, 2000))
	}
}

// Stop stops the server cleanly (SIGTERM: it closes its clients and writes
// its streams' state) and waits until it is gone.
func (s *NATSServer) Stop(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil {
		p.stop(syscall.SIGTERM, 30*time.Second)
	}
}

// Kill SIGKILLs the server: the next Start recovers the file store from
// what reached the disk.
func (s *NATSServer) Kill(t testing.TB) {
	t.Helper()
	if p := s.current(); p != nil {
		p.stop(syscall.SIGKILL, 5*time.Second)
	}
}

// Log returns the end of the server's log, for failure messages.
func (s *NATSServer) Log() string { return tailFile(s.dir+"/nats.log", 4000) }
