package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/integration/netlab"
	"github.com/warmfleet/warmfleet/integration/netlab/netlabtest"
	"github.com/warmfleet/warmfleet/internal/testutil/wait"
)

// node is what the kubelet would give the daemon's container on one lab
// host: the environment from the downward API, and each volume as a
// directory of the host's own file system tree.
type node struct {
	host   *netlab.Host
	root   string            // the node's "/" for hostPath volumes
	mounts map[string]string // container mountPath -> directory here
	env    map[string]string
	args   []string
	daemon *netlab.Daemon // once started
}

// podFor plays the kubelet's part for container c of spec on host h:
// hostPath volumes become directories under root, Secrets and ConfigMaps
// (objects, by "Kind/name") are written with their defaultMode, downward API fields take the host's values, $(VAR) in
// arguments is expanded, and paths under a mount point are rewritten to
// where that mount lives here (the lab's hosts share one file system).
func podFor(t *testing.T, h *netlab.Host, root string, spec *corev1.PodSpec, c *corev1.Container, objects map[string]map[string][]byte) *node {
	t.Helper()
	n := &node{host: h, root: root, mounts: map[string]string{}, env: map[string]string{}}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		var dir string
		switch {
		case v.HostPath != nil:
			dir = filepath.Join(root, v.HostPath.Path)
		case v.Secret != nil:
			dir = filepath.Join(root, "secret-volumes", m.Name)
			writeVolume(t, dir, objects["Secret/"+v.Secret.SecretName], v.Secret.Items, v.Secret.DefaultMode)
		case v.ConfigMap != nil:
			dir = filepath.Join(root, "configmap-volumes", m.Name)
			writeVolume(t, dir, objects["ConfigMap/"+v.ConfigMap.Name], v.ConfigMap.Items, v.ConfigMap.DefaultMode)
		case v.EmptyDir != nil:
			dir = filepath.Join(root, "empty-dirs", m.Name)
		default:
			t.Fatalf("volume %s: kind not emulated: %+v", m.Name, v.VolumeSource)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		n.mounts[m.MountPath] = dir
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			n.env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "spec.nodeName":
				n.env[e.Name] = h.Name
			case "status.hostIP", "status.podIP": // hostNetwork: the same
				n.env[e.Name] = h.IP.String()
			case "metadata.name":
				n.env[e.Name] = "pod-on-" + h.Name
			default:
				t.Fatalf("env %s: field %s not emulated", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.ResourceFieldRef != nil:
			res := strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits.")
			q, ok := c.Resources.Limits[corev1.ResourceName(res)]
			if !ok {
				t.Fatalf("env %s: no %s limit", e.Name, res)
			}
			n.env[e.Name] = fmt.Sprint(q.Value())
		default:
			t.Fatalf("env %s: source not emulated", e.Name)
		}
	}
	// Longest mount points first, so /a/b wins over /a.
	points := make([]string, 0, len(n.mounts))
	for p := range n.mounts {
		points = append(points, p)
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, a := range c.Args {
		a = envRef.ReplaceAllStringFunc(a, func(ref string) string { return n.env[ref[2:len(ref)-1]] })
		n.args = append(n.args, rewritePath(a, points, n.mounts))
	}
	return n
}

// writeVolume writes a Secret's or ConfigMap's data into dir: the listed
// items, or every key, with mode (the API's default 0644 when nil).
func writeVolume(t *testing.T, dir string, data map[string][]byte, items []corev1.KeyToPath, mode *int32) {
	t.Helper()
	if data == nil {
		t.Fatalf("%s: the object is missing", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	perm := os.FileMode(0o644)
	if mode != nil {
		perm = os.FileMode(*mode)
	}
	if len(items) == 0 {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			t.Fatalf("%s: no key %s", dir, it.Key)
		}
		if err := os.WriteFile(filepath.Join(dir, it.Path), v, perm); err != nil {
			t.Fatal(err)
		}
	}
}

// rewritePath maps a --flag=VALUE whose value (or unix:// socket path) lies
// under a mount point to the directory that mount has here.
func rewritePath(arg string, points []string, mounts map[string]string) string {
	flag, value, ok := strings.Cut(arg, "=")
	if !ok {
		return arg
	}
	scheme := ""
	if rest, ok := strings.CutPrefix(value, "unix://"); ok {
		scheme, value = "unix://", rest
	}
	for _, p := range points {
		if value == p || strings.HasPrefix(value, p+"/") {
			return flag + "=" + scheme + mounts[p] + strings.TrimPrefix(value, p)
		}
	}
	return arg
}

func (n *node) environ() []string {
	var env []string
	for k, v := range n.env {
		env = append(env, k+"="+v)
	}
	return env
}

// get fetches http://ADDR/path from inside the node's network namespace.
func (n *node) get(ctx context.Context, addr, path string) (int, string, error) {
	return n.getAuth(ctx, addr, path, "")
}

// getAuth is get with a bearer token, if not "".
func (n *node) getAuth(ctx context.Context, addr, path, token string) (int, string, error) {
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		return n.host.NS.DialContext(ctx, network, a)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b), err
}

// resolveInLab makes name resolve to addrs, in that order, for processes
// in the lab's hosts: `ip netns exec` bind-mounts /etc/netns/NS/hosts over
// /etc/hosts for them, which is how cluster DNS's answer for a headless
// Service is played here. resolv.conf points at the host's own loopback,
// so no query leaves it.
func resolveInLab(t *testing.T, hosts []*netlab.Host, name string, addrs []string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n")
	for _, a := range addrs {
		fmt.Fprintf(&b, "%s %s\n", a, name)
	}
	for _, h := range hosts {
		dir := filepath.Join("/etc/netns", h.NS.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestChartDaemonsFormAFleet starts daemons on lab hosts with exactly the
// arguments and environment of the chart's DaemonSet (the kubelet's part
// played by podFor): they join through the headless Service's name, which
// resolves to every host, form one fleet, cache a model from S3, and
// answer the probes on the metrics port. A flag the binary lacks, a path
// the mounts do not cover or a $(VAR) the pod does not define fails here.
//
// The join name lists a host with no daemon first: the others find each
// other only if a join contacts every address of the name, not the first.
func TestChartDaemonsFormAFleet(t *testing.T) {
	lab := netlabtest.New(t, netlab.Options{Hosts: 4, Link: 500 * netlab.Mbit, S3: true})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	bin, err := netlabtest.BuildWarmfleet(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	model, err := lab.S3().SeedModel(ctx, "models", "small/", 2, 2<<20, 7)
	if err != nil {
		t.Fatal(err)
	}
	// The S3 endpoint and credentials go in through the chart's own
	// daemon.env value; containerd is off (no containerd per lab host).
	var env []map[string]string
	for _, kv := range lab.S3().Env() {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, map[string]string{"name": k, "value": v})
	}
	envJSON, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, mustTemplate(t, "--set", "daemon.containerd.enabled=false", "--set-string", "daemon.reserve=0",
		"--set", "daemon.reserveFraction=0", "--set-json", "daemon.env="+string(envJSON)))
	ds := r.daemonSet(t)
	spec := &ds.Spec.Template.Spec
	c := &spec.Containers[0]

	k, err := gossip.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key := []byte(gossip.EncodeKey(k) + "\n")
	keyVol := volume(t, spec, "cluster-key").Secret
	token := []byte("router-admin-token-for-the-test\n")
	objects := map[string]map[string][]byte{"Secret/" + keyVol.SecretName: {keyVol.Items[0].Key: key}}
	ri := slices.IndexFunc(r.deployments, func(d appsv1.Deployment) bool { return strings.HasSuffix(d.Name, "-router") })
	if ri < 0 {
		t.Fatal("no router Deployment")
	}
	rd := &r.deployments[ri]
	rspec := &rd.Spec.Template.Spec
	tokVol := volume(t, rspec, "admin-token").Secret
	objects["Secret/"+tokVol.SecretName] = map[string][]byte{tokVol.Items[0].Key: token}
	for _, cm := range r.configMaps {
		objects["ConfigMap/"+cm.Name] = map[string][]byte{}
		for k, v := range cm.Data {
			objects["ConfigMap/"+cm.Name][k] = []byte(v)
		}
	}

	hosts := lab.Hosts()[:3] // the daemons' nodes; the fourth runs a router
	join, _ := flagValue(c.Args, "join")
	joinHost, _, err := net.SplitHostPort(join)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, h := range hosts {
		addrs = append(addrs, h.IP.String())
	}
	resolveInLab(t, lab.Hosts(), joinHost, addrs)

	nodes := make([]*node, len(hosts))
	for i, h := range hosts {
		nodes[i] = podFor(t, h, filepath.Join(lab.RunDir(), "n"+h.Name), spec, c, objects)
	}
	start := func(n *node) {
		t.Helper()
		p, err := n.host.Start(netlab.ProcSpec{Name: "warmfleet", Path: bin, Args: n.args, Env: n.environ()})
		if err != nil {
			t.Fatal(err)
		}
		apiAddr, _ := flagValue(n.args, "api")
		if n.daemon, err = netlab.AttachDaemon(p, bin, apiAddr); err != nil {
			t.Fatal(err)
		}
	}
	alive := func(n *node) ([]string, error) {
		out, err := n.daemon.CLI(ctx, "fleet", "-o", "json")
		if err != nil {
			return nil, err
		}
		var f api.Fleet
		if err := json.Unmarshal(out, &f); err != nil {
			return nil, err
		}
		var names []string
		for _, m := range f.Members {
			if m.State == "alive" {
				names = append(names, m.Name)
			}
		}
		slices.Sort(names)
		return names, nil
	}
	seeAll := func(ns []*node, want ...string) {
		t.Helper()
		for _, n := range ns {
			wait.Err(t, n.host.Name+" sees "+strings.Join(want, ","), func() error {
				if !n.daemon.Running() {
					return fmt.Errorf("daemon exited: %v\n%s", n.daemon.Wait(), n.daemon.Log())
				}
				got, err := alive(n)
				if err != nil {
					return err
				}
				if !slices.Equal(got, want) {
					return fmt.Errorf("alive %v", got)
				}
				return nil
			}, wait.Timeout(time.Minute))
		}
	}

	// h1 and h2 first: the name's first address (h0) answers nothing.
	start(nodes[1])
	start(nodes[2])
	seeAll(nodes[1:], hosts[1].Name, hosts[2].Name)
	start(nodes[0])
	seeAll(nodes, hosts[0].Name, hosts[1].Name, hosts[2].Name)

	if _, err := nodes[0].daemon.CLI(ctx, "cache", "add", "small", "--source", model.Source()); err != nil {
		t.Fatal(err)
	}
	metricsAddr := func(n *node) string { v, _ := flagValue(n.args, "metrics-listen"); return v }
	for _, n := range nodes {
		wait.Err(t, n.host.Name+" has the model ready", func() error {
			st, err := n.daemon.CacheStatus(ctx, "small")
			if err != nil {
				return err
			}
			if !st.Ready {
				return fmt.Errorf("state %s", st.State)
			}
			if !strings.HasPrefix(st.Path, n.mounts[mount(t, c, "data").MountPath]) {
				return fmt.Errorf("model at %s, outside the data volume", st.Path)
			}
			return model.Verify(st.Path)
		}, wait.Timeout(2*time.Minute))
		// The probes' endpoints and the scrape target, where the chart
		// points them.
		for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
			if code, body, err := n.get(ctx, metricsAddr(n), p.HTTPGet.Path); err != nil || code != http.StatusOK {
				t.Errorf("%s: GET %s on the metrics port: %d %v %s", n.host.Name, p.HTTPGet.Path, code, err, body)
			}
		}
		_, body, err := n.get(ctx, metricsAddr(n), "/metrics")
		if err != nil || !strings.Contains(body, `warmfleet_cache_state{model="small",state="ready"} 1`) {
			t.Errorf("%s: /metrics on the metrics port lacks the ready model: %v", n.host.Name, err)
		}
	}

	// A router replica with the Deployment's arguments joins the same name:
	// it answers its probes without the token, /metrics only with it, and
	// sees the three daemons and itself.
	rh := lab.Hosts()[3]
	rc := &rspec.Containers[0]
	rn := podFor(t, rh, filepath.Join(lab.RunDir(), "n"+rh.Name), rspec, rc, objects)
	if _, err := rh.Start(netlab.ProcSpec{Name: "router", Path: bin, Args: rn.args, Env: rn.environ()}); err != nil {
		t.Fatal(err)
	}
	admin, _ := flagValue(rn.args, "admin-listen")
	for _, p := range []*corev1.Probe{rc.StartupProbe, rc.LivenessProbe} {
		wait.Err(t, "router "+p.HTTPGet.Path, func() error {
			code, body, err := rn.get(ctx, admin, p.HTTPGet.Path)
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("%d %s", code, body)
			}
			return err
		}, wait.Timeout(time.Minute))
	}
	if code, _, err := rn.get(ctx, admin, "/metrics"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("router /metrics without the token: %d %v, want 401", code, err)
	}
	wait.Err(t, "router sees the fleet", func() error {
		_, body, err := rn.getAuth(ctx, admin, "/metrics", strings.TrimSpace(string(token)))
		if err != nil {
			return err
		}
		if !strings.Contains(body, `warmfleet_gossip_members{state="alive"} 4`) {
			return fmt.Errorf("gossip members: %s", grepLines(body, "warmfleet_gossip_members"))
		}
		return nil
	}, wait.Timeout(time.Minute))
}

func grepLines(text, prefix string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}
