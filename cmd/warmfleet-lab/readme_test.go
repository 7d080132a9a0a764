package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A README block the test runs is a ```sh fence right after a line
// `<!-- runnable -->` (run in a fresh temporary directory, with the
// binaries the install block built first on PATH) or `<!-- runnable: repo
// -->` (run in the repository, before the others: the install block, with
// GOBIN pointing at the test's own bin directory). Blocks that need root
// on a real host, containerd, Kubernetes or several machines stay
// unmarked, and the README says so next to them.
const (
	markRunnable = "<!-- runnable -->"
	markRepo     = "<!-- runnable: repo -->"
)

// readmeBlock is one marked block of the README.
type readmeBlock struct {
	line   int // the line of its opening fence, 1-based
	inRepo bool
	script string
}

// readmeBlocks finds the marked blocks of a README.
func readmeBlocks(text string) ([]readmeBlock, error) {
	var blocks []readmeBlock
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		mark := strings.TrimSpace(lines[i])
		if mark != markRunnable && mark != markRepo {
			continue
		}
		if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```sh" {
			return nil, fmt.Errorf("README.md:%d: %s must be followed by a ```sh fence", i+1, mark)
		}
		b := readmeBlock{line: i + 2, inRepo: mark == markRepo}
		end := -1
		for j := i + 2; j < len(lines); j++ {
			if strings.TrimSpace(lines[j]) == "```" {
				end = j
				break
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("README.md:%d: the block never closes", b.line)
		}
		b.script = strings.Join(lines[i+2:end], "\n") + "\n"
		blocks = append(blocks, b)
		i = end
	}
	return blocks, nil
}

func TestReadmeBlocksParse(t *testing.T) {
	text := "intro\n" + markRepo + "\n```sh\ngo install ./cmd/...\n```\nplain\n```sh\nnot run\n```\n" +
		markRunnable + "\n```sh\na\nb\n```\n"
	blocks, err := readmeBlocks(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []readmeBlock{{line: 3, inRepo: true, script: "go install ./cmd/...\n"}, {line: 11, script: "a\nb\n"}}
	if !slices.Equal(blocks, want) {
		t.Fatalf("blocks = %+v, want %+v", blocks, want)
	}
	for _, bad := range []string{markRunnable + "\ntext\n", markRunnable + "\n```sh\nnever closed\n"} {
		if _, err := readmeBlocks(bad); err == nil {
			t.Errorf("readmeBlocks(%q) accepted a broken mark", bad)
		}
	}
}

// TestReadme runs every block of README.md marked runnable, as written:
// first the install blocks in the repository (they build the binaries into
// the test's bin directory), then each other block in a temporary
// directory of its own, with those binaries first on PATH and no AWS_* or
// WARMFLEET_* settings from outside. As root, each of those runs in a new
// network namespace with only loopback up, so the fixed ports the README
// uses cannot clash with anything else on the machine. A block that fails
// fails the test with the block's line in README.md and its output.
func TestReadme(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the README's commands, the demo among them: not in -short")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := readmeBlocks(string(text))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	env := readmeEnv(bin)
	ran := 0
	for _, b := range blocks {
		if b.inRepo {
			runReadmeBlock(t, b, root, append(env, "GOBIN="+bin), false)
			ran++
		}
	}
	for _, name := range []string{"warmfleet", "warmfleet-lab"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			t.Fatalf("the README's install blocks did not build %s: %v", name, err)
		}
	}
	netns := os.Geteuid() == 0
	if netns {
		if _, err := exec.LookPath("unshare"); err != nil {
			netns = false
		}
	}
	for _, b := range blocks {
		if !b.inRepo {
			runReadmeBlock(t, b, t.TempDir(), env, netns)
			ran++
		}
	}
	if ran < 3 {
		t.Fatalf("ran %d README blocks: the marks are missing", ran)
	}
}

// readmeEnv is the environment the blocks run in: this process's, without
// AWS_* and WARMFLEET_* settings, with bin first on PATH.
func readmeEnv(bin string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "AWS_") || strings.HasPrefix(kv, "WARMFLEET_") || strings.HasPrefix(kv, "PATH=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// readmeBlockTimeout bounds one block; the demo is the longest.
const readmeBlockTimeout = 8 * time.Minute

// runReadmeBlock runs one block with bash -eu -o pipefail in dir, and kills
// whatever it left running.
func runReadmeBlock(t *testing.T, b readmeBlock, dir string, env []string, netns bool) {
	t.Helper()
	script := "set -euo pipefail\n" + b.script
	if netns {
		script = "ip link set lo up\n" + script
	}
	file := filepath.Join(t.TempDir(), "block.sh")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), readmeBlockTimeout)
	defer cancel()
	args := []string{"bash", file}
	if netns {
		args = append([]string{"unshare", "--net", "--"}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The block's background jobs are in its process group: on a timeout,
	// and after it ends, the whole group goes.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer // exec writes it from one goroutine at a time: same writer for both
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	t.Logf("README.md:%d: ran in %s", b.line, time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Errorf("README.md:%d: the block fails: %v\n--- block\n%s--- output\n%s", b.line, err, b.script, tail(out.String(), 60))
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n") + "\n"
}
