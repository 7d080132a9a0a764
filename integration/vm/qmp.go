package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// qmpClient speaks qemu's machine protocol (QMP, JSON lines on a unix
// socket): the host's way to save a running guest's state and to plug the
// data disk into a restored one.
type qmpClient struct {
	conn net.Conn
	dec  *json.Decoder
}

// qmpMessage is a greeting, a reply or an event; replies carry Return or
// Error.
type qmpMessage struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class, Desc string
	} `json:"error"`
	Event string `json:"event"`
}

// dialQMP connects to qemu's QMP socket, which qemu creates shortly after
// its start, and leaves the greeting's capability negotiation done.
func dialQMP(ctx context.Context, path string, exited <-chan struct{}) (*qmpClient, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err == nil {
			q := &qmpClient{conn: conn, dec: json.NewDecoder(conn)}
			var greeting qmpMessage
			if err := q.read(ctx, &greeting); err != nil {
				conn.Close()
				return nil, fmt.Errorf("qmp greeting: %w", err)
			}
			if err := q.run(ctx, "qmp_capabilities", nil, nil); err != nil {
				conn.Close()
				return nil, err
			}
			return q, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp %s: %w (last: %v)", path, ctx.Err(), err)
		case <-exited:
			return nil, errors.New("qmp: qemu exited")
		case <-tick.C:
		}
	}
}

func (q *qmpClient) read(ctx context.Context, m *qmpMessage) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	if err := q.conn.SetReadDeadline(deadline); err != nil {
		return err
	}
	return q.dec.Decode(m)
}

// run executes a command and decodes its return value into out (nil:
// ignored), skipping the events qemu sends in between.
func (q *qmpClient) run(ctx context.Context, cmd string, args, out any) error {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		var m qmpMessage
		if err := q.read(ctx, &m); err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, err)
		}
		switch {
		case m.Event != "":
			continue
		case m.Error != nil:
			return fmt.Errorf("qmp %s: %s: %s", cmd, m.Error.Class, m.Error.Desc)
		case out != nil:
			if err := json.Unmarshal(m.Return, out); err != nil {
				return fmt.Errorf("qmp %s: %w", cmd, err)
			}
		}
		return nil
	}
}

// poll runs cmd every few milliseconds until done says its return value
// ends the wait (true), or says it failed (error).
func (q *qmpClient) poll(ctx context.Context, cmd string, out any, done func() (bool, error)) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := q.run(ctx, cmd, nil, out); err != nil {
			return err
		}
		ok, err := done()
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
		case <-tick.C:
		}
	}
}

func (q *qmpClient) close() { _ = q.conn.Close() }
