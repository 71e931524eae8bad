package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RabbitMQNode is a private RabbitMQ node a test owns: its own node name,
// AMQP and distribution ports, data directory, Erlang cookie and config
// file. The machine's RabbitMQ reads its listener (5672) from the system
// config, so a private node never reads /etc/rabbitmq: the node gets its own
// RABBITMQ_CONFIG_FILE and RABBITMQ_CONF_ENV_FILE.
//
// Stop, Kill and Start may be called in any order while the test runs; the
// node keeps its data (durable queues, their messages) across them.
type RabbitMQNode struct {
	// URL is the node's AMQP URL, amqp://guest:guest@127.0.0.1:<port>/.
	URL string
	// Name is the Erlang node name, e.g. berth-1a2b3c@localhost.
	Name string
	// Port is the AMQP port.
	Port int

	dir    string
	script string
	ctl    string
	env    []string
	server
}

// rabbitmqScripts finds rabbitmq-server and rabbitmqctl. The Debian package's
// /usr/sbin/rabbitmq-server is a wrapper that switches to the rabbitmq user
// and its system files; the scripts under /usr/lib/rabbitmq run as the caller.
func rabbitmqScripts() (server, ctl string, err error) {
	server, err = findBinary("rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server")
	if err != nil {
		return "", "", err
	}
	ctl, err = findBinary("rabbitmqctl", filepath.Join(filepath.Dir(server), "rabbitmqctl"))
	return server, ctl, err
}

func randomName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// StartRabbitMQ starts a private single RabbitMQ node and waits until it
// accepts AMQP connections (about five seconds). The node is stopped and its
// files removed when the test ends. Without RabbitMQ installed the test is
// skipped (failed under CI=true).
func StartRabbitMQ(t testing.TB) *RabbitMQNode {
	t.Helper()
	nodes := StartRabbitMQCluster(t, 1)
	return nodes[0]
}

// StartRabbitMQCluster starts n private RabbitMQ nodes that form one cluster
// (classic peer discovery, one shared Erlang cookie) and waits until every
// node accepts AMQP connections and the cluster has n running nodes.
func StartRabbitMQCluster(t testing.TB, n int) []*RabbitMQNode {
	t.Helper()
	script, ctl, err := rabbitmqScripts()
	if err != nil {
		missing(t, "RabbitMQ", err)
		return nil
	}
	if _, err := exec.LookPath("erl"); err != nil {
		missing(t, "RabbitMQ", fmt.Errorf("erl (Erlang) not found: %w", err))
		return nil
	}
	base, err := os.MkdirTemp("", "berth-rabbitmq-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	// One HOME for every node: the Erlang cookie in it is what lets them
	// (and rabbitmqctl) talk to each other.
	home := filepath.Join(base, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(randomName("berthcookie")), 0o400); err != nil {
		t.Fatal(err)
	}
	id := randomName("berth-")
	nodes := make([]*RabbitMQNode, n)
	for i := range nodes {
		port, err1 := freePort()
		dist, err2 := freePort()
		if err1 != nil || err2 != nil {
			t.Fatalf("free port: %v %v", err1, err2)
		}
		nodes[i] = &RabbitMQNode{
			URL:    fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port),
			Name:   fmt.Sprintf("%s-%d@localhost", id, i),
			Port:   port,
			dir:    filepath.Join(base, fmt.Sprintf("node%d", i)),
			script: script,
			ctl:    ctl,
		}
		nodes[i].env = []string{"HOME=" + home, "RABBITMQ_NODE_PORT=" + fmt.Sprint(port), "RABBITMQ_DIST_PORT=" + fmt.Sprint(dist)}
	}
	for _, node := range nodes {
		conf := []string{
			fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d", node.Port),
			"loopback_users = none",
			"log.console = true",
			"log.console.level = warning",
			"log.file = false",
		}
		if n > 1 {
			conf = append(conf, "cluster_formation.peer_discovery_backend = classic_config")
			for j, peer := range nodes {
				conf = append(conf, fmt.Sprintf("cluster_formation.classic_config.nodes.%d = %s", j+1, peer.Name))
			}
		}
		if err := os.MkdirAll(node.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		files := map[string]string{
			"rabbitmq.conf":     strings.Join(conf, "\n") + "\n",
			"rabbitmq-env.conf": "# a private node: nothing from /etc/rabbitmq\n",
			"enabled_plugins":   "[].\n",
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(node.dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		node.env = append(node.env,
			"RABBITMQ_NODENAME="+node.Name,
			"RABBITMQ_CONFIG_FILE="+filepath.Join(node.dir, "rabbitmq.conf"),
			"RABBITMQ_CONF_ENV_FILE="+filepath.Join(node.dir, "rabbitmq-env.conf"),
			"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(node.dir, "enabled_plugins"),
			"RABBITMQ_MNESIA_BASE="+filepath.Join(node.dir, "mnesia"),
			"RABBITMQ_LOG_BASE="+filepath.Join(node.dir, "log"),
			"RABBITMQ_PLUGINS_EXPAND_DIR="+filepath.Join(node.dir, "plugins"),
			"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		)
		t.Cleanup(func() {
			if p := node.current(); p != nil {
				p.stop(syscall.SIGKILL, 5*time.Second)
			}
		})
	}
	// Clustered nodes discover each other while they boot: start them together.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() { errs[i] = node.start() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n > 1 {
		if err := nodes[0].waitClusterSize(n, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

func (n *RabbitMQNode) start() error {
	if p := n.current(); p != nil && !p.exited() {
		return fmt.Errorf("rabbitmq node %s is running", n.Name)
	}
	cmd := exec.Command(n.script)
	cmd.Dir = n.dir
	cmd.Env = append(os.Environ(), n.env...)
	logPath := filepath.Join(n.dir, "console.log")
	p, err := startProc(cmd, logPath)
	if err != nil {
		return fmt.Errorf("start rabbitmq node %s: %w", n.Name, err)
	}
	n.set(p)
	if err := waitTCP(p, fmt.Sprintf("127.0.0.1:%d", n.Port), 90*time.Second); err != nil {
		p.stop(syscall.SIGKILL, 5*time.Second)
		return fmt.Errorf("rabbitmq node %s: %w\n%s", n.Name, err, tailFile(logPath, 2000))
	}
	return nil
}

// Start starts the node again after Stop or Kill, with its data, and waits
// until it accepts AMQP connections.
func (n *RabbitMQNode) Start(t testing.TB) {
	t.Helper()
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
}

// Stop shuts the node down cleanly (SIGTERM) and waits until it is gone.
func (n *RabbitMQNode) Stop(t testing.TB) {
	t.Helper()
	if p := n.current(); p != nil {
		p.stop(syscall.SIGTERM, 30*time.Second)
	}
}

// Kill SIGKILLs the node's processes, as a crashed machine would.
func (n *RabbitMQNode) Kill(t testing.TB) {
	t.Helper()
	if p := n.current(); p != nil {
		p.stop(syscall.SIGKILL, 10*time.Second)
	}
}

// Ctl runs rabbitmqctl against this node and returns its output.
func (n *RabbitMQNode) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.ctlOutput(args...)
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// User adds the login name (password "pw") to this node with the
// permissions configure, write and read (regular expressions, as
// rabbitmqctl set_permissions takes them) on the vhost "/", and returns
// the node's URL with that login. A private node goes with its test, the
// login with it.
func (n *RabbitMQNode) User(t testing.TB, name, configure, write, read string) string {
	t.Helper()
	n.Ctl(t, "add_user", name, "pw")
	n.Ctl(t, "set_permissions", "-p", "/", name, configure, write, read)
	return strings.Replace(n.URL, "guest:guest", name+":pw", 1)
}

func (n *RabbitMQNode) ctlOutput(args ...string) (string, error) {
	cmd := exec.Command(n.ctl, append([]string{"-n", n.Name}, args...)...)
	cmd.Env = append(os.Environ(), n.env...)
	cmd.Dir = n.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitClusterSize waits until the node reports size running nodes.
func (n *RabbitMQNode) waitClusterSize(size int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var out string
	for time.Now().Before(deadline) {
		var err error
		out, err = n.ctlOutput("eval", "length(rabbit_nodes:all_running()).")
		if err == nil && strings.TrimSpace(out) == fmt.Sprint(size) {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("rabbitmq cluster of %s: want %d running nodes, last answer %q", n.Name, size, out)
}
