// The thin `cocoon` client of the simulator (docs/simulator.md, "Server mode").
//
// A `cocoon` call used to be a Node process of its own (40 ms of CPU idle, 0.2-0.35 CPU-s under
// load), so a benchmark of many concurrent calls measured the simulator. This client costs a
// few milliseconds: it connects to the root's simulator server (sim/server.ts, an abstract unix
// socket named after the root), sends argv, environment, working directory and pid, streams
// stdin when the verb asks for it, writes stdout/stderr chunks as they arrive and exits with
// the verb's status. SIGTERM/SIGINT are forwarded (the server either runs the verb's handler,
// e.g. `vm status --event` exits 0, or tells the client to die by that signal); when the client
// dies, its socket closes and the server abandons the request at its next await point.
//
// Without a server (none running, COCOON_SIM_SERVER=0, a relative root, another root's server)
// it execs the Node simulator (sim/main.ts) exactly as bin/cocoon-sim did before. The `cocoon`
// symlink of a simulator root points here directly (bash would add about 5 ms of CPU per call);
// bin/cocoon-sim execs it too.
//
// Standard library only. Frames: 1 byte type, 4 bytes big-endian length, payload (see
// sim/protocol.ts, which must stay in sync).
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

const protocolVersion = 1

type hello struct {
	V    int      `json:"v"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Cwd  string   `json:"cwd"`
	Pid  int      `json:"pid"`
}

func main() {
	// Invoked through a symlink (`cocoon`, `cocoon-sim`): that name says which CLI this is.
	// Under its own name (exec'd by bin/cocoon-sim, or by sim/client.ts) the caller says it.
	if name := filepath.Base(os.Args[0]); name != "cocoon-sim-client" || os.Getenv("COCOON_SIM_ARGV0") == "" {
		os.Setenv("COCOON_SIM_ARGV0", name)
	}
	if os.Getenv("COCOON_SIM_SERVER") != "0" {
		if conn := dial(); conn != nil {
			code, fallBack := serve(conn)
			if !fallBack {
				os.Exit(code)
			}
		}
	}
	fallback()
}

// dial connects to the root's server; nil when there is none.
func dial() *net.UnixConn {
	root := os.Getenv("COCOON_SIM_ROOT")
	if root == "" {
		root = os.Getenv("COCOON_ROOT_DIR")
	}
	if root == "" {
		root = "/var/lib/cocoon"
	}
	if !filepath.IsAbs(root) {
		return nil // relative to the cwd: leave it to the fallback
	}
	sum := sha256.Sum256([]byte(filepath.Clean(root)))
	addr := &net.UnixAddr{Name: "@cocoon-sim-" + hex.EncodeToString(sum[:])[:32], Net: "unix"}
	conn, err := net.DialUnix("unix", nil, addr)
	if err != nil {
		return nil
	}
	return conn
}

type client struct {
	conn *net.UnixConn
	mu   sync.Mutex
}

func (c *client) send(t byte, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	buf := make([]byte, 5+len(payload))
	buf[0] = t
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(payload)))
	copy(buf[5:], payload)
	_, err := c.conn.Write(buf)
	return err
}

// serve runs the call through the server; fallBack is true when the server declined it
// before running anything.
func serve(conn *net.UnixConn) (code int, fallBack bool) {
	c := &client{conn: conn}
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "/"
	}
	h, _ := json.Marshal(hello{V: protocolVersion, Argv: os.Args[1:], Env: os.Environ(), Cwd: cwd, Pid: os.Getpid()})
	if c.send('H', h) != nil {
		return 0, true
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGPIPE)
	go func() {
		for s := range sigs {
			sig := s.(syscall.Signal)
			if sig == syscall.SIGPIPE {
				continue // writes to a closed stdout return EPIPE instead (Node ignores SIGPIPE too)
			}
			name := "SIGTERM"
			if sig == syscall.SIGINT {
				name = "SIGINT"
			}
			if c.send('S', []byte(name)) != nil {
				die(sig)
			}
			// The server answers at once (exit or kill); do not outlive a wedged one.
			time.AfterFunc(5*time.Second, func() { die(sig) })
		}
	}()

	r := bufio.NewReaderSize(conn, 64<<10)
	hdr := make([]byte, 5)
	var buf []byte
	stdoutBroken := false
	started := false
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			os.Stderr.WriteString("Error: cocoon simulator server closed the connection\n")
			return 1, false
		}
		n := int(binary.BigEndian.Uint32(hdr[1:5]))
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		p := buf[:n]
		if _, err := io.ReadFull(r, p); err != nil {
			os.Stderr.WriteString("Error: cocoon simulator server closed the connection\n")
			return 1, false
		}
		switch hdr[0] {
		case 'O':
			if !stdoutBroken {
				if _, err := os.Stdout.Write(p); err != nil {
					stdoutBroken = true
					c.send('P', nil)
				}
			}
		case 'E':
			os.Stderr.Write(p)
		case 'W':
			if !started {
				started = true
				go pumpStdin(c)
			}
		case 'X':
			return int(int32(binary.BigEndian.Uint32(p))), false
		case 'K':
			sig := syscall.SIGTERM
			if string(p) == "SIGINT" {
				sig = syscall.SIGINT
			}
			die(sig)
		case 'F':
			conn.Close()
			signal.Reset()
			return 0, true
		}
	}
}

func pumpStdin(c *client) {
	buf := make([]byte, 64<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			if c.send('I', buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			c.send('Z', nil)
			return
		}
	}
}

// die ends the client the way the signal would have ended a process without a handler.
func die(sig syscall.Signal) {
	signal.Reset(sig)
	syscall.Kill(os.Getpid(), sig)
	time.Sleep(time.Second)
	os.Exit(128 + int(sig))
}

// fallback replaces this process with the Node simulator (process mode).
func fallback() {
	home := os.Getenv("COCOON_SIM_HOME")
	if home == "" {
		exe, err := os.Executable()
		if err == nil {
			// <repo>/node_modules/.cache/vk-cocoon/cocoon-sim-client
			home = filepath.Join(filepath.Dir(exe), "..", "..", "..")
		}
	}
	node := filepath.Join(home, "node_modules", ".bin", "node")
	env := os.Environ()
	if os.Getenv("NODE_COMPILE_CACHE") == "" {
		tmp := os.Getenv("TMPDIR")
		if tmp == "" {
			tmp = "/tmp"
		}
		env = append(env, "NODE_COMPILE_CACHE="+filepath.Join(tmp, "cocoon-sim-node-cache"))
	}
	args := append([]string{node, filepath.Join(home, "sim", "main.ts")}, os.Args[1:]...)
	err := syscall.Exec(node, args, env)
	os.Stderr.WriteString("Error: cocoon-sim: exec " + node + ": " + err.Error() + "\n")
	os.Exit(1)
}
