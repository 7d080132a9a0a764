package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/warmfleet/warmfleet/internal/kube/nodelabels"
	"github.com/warmfleet/warmfleet/internal/kube/podendpoints"
	"github.com/warmfleet/warmfleet/internal/testutil/testenv"
	"github.com/warmfleet/warmfleet/router"
)

const (
	chartDir    = "helm/warmfleet"
	release     = "warmfleet"
	namespace   = "warmfleet"
	monitoringV = "monitoring.coreos.com/v1"
	defaultData = "/opt/dlami/nvme/warmfleet"
)

// helmTemplate runs `helm template` on the chart with extra arguments.
func helmTemplate(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	helm := testenv.Bin(t, "helm")
	cmd := exec.Command(helm, append([]string{"template", release, chartDir, "--namespace", namespace}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm template %v: %w: %s", args, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

func mustTemplate(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := helmTemplate(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rendered is a chart rendering decoded into API types.
type rendered struct {
	daemonSets      []appsv1.DaemonSet
	deployments     []appsv1.Deployment
	services        []corev1.Service
	configMaps      []corev1.ConfigMap
	serviceAccounts []corev1.ServiceAccount
	clusterRoles    []rbacv1.ClusterRole
	clusterBindings []rbacv1.ClusterRoleBinding
	roles           []rbacv1.Role
	roleBindings    []rbacv1.RoleBinding
	podMonitors     []podMonitor
	rules           []prometheusRule
	kinds           []string
}

// The Prometheus Operator's types are not a dependency: these mirror the
// fields the chart uses, with the CRDs' names, so strict decoding still
// catches a misspelled field.
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
			Authorization *struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// decode splits a multi-document rendering and decodes each object strictly
// into its API type: an unknown or misspelled field fails.
func decode(t *testing.T, manifest []byte) rendered {
	t.Helper()
	var r rendered
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(manifest), -1) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		if meta.Kind == "" {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) != "" {
				t.Fatalf("document %d has no kind:\n%s", i, doc)
			}
			continue
		}
		var target any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 DaemonSet":
			target = add(&r.daemonSets)
		case "apps/v1 Deployment":
			target = add(&r.deployments)
		case "v1 Service":
			target = add(&r.services)
		case "v1 ConfigMap":
			target = add(&r.configMaps)
		case "v1 ServiceAccount":
			target = add(&r.serviceAccounts)
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			target = add(&r.clusterRoles)
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			target = add(&r.clusterBindings)
		case "rbac.authorization.k8s.io/v1 Role":
			target = add(&r.roles)
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			target = add(&r.roleBindings)
		case monitoringV + " PodMonitor":
			target = add(&r.podMonitors)
		case monitoringV + " PrometheusRule":
			target = add(&r.rules)
		default:
			t.Fatalf("document %d: unexpected %s %s", i, meta.APIVersion, meta.Kind)
		}
		if err := strictDecode([]byte(doc), target); err != nil {
			t.Fatalf("%s (document %d) does not decode strictly: %v\n%s", meta.Kind, i, err, doc)
		}
		r.kinds = append(r.kinds, meta.Kind)
	}
	return r
}

// add appends a zero T to *s and returns it, to decode into.
func add[T any](s *[]T) *T {
	*s = append(*s, *new(T))
	return &(*s)[len(*s)-1]
}

// strictDecode decodes YAML the way the API server reads JSON: field names
// case-sensitive (encoding/json would take readonly for readOnly), unknown
// and duplicate fields refused.
func strictDecode(doc []byte, target any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, target)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func (r rendered) daemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	if len(r.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(r.daemonSets))
	}
	return &r.daemonSets[0]
}

func (r rendered) configMap(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	for i := range r.configMaps {
		if r.configMaps[i].Name == name {
			return &r.configMaps[i]
		}
	}
	t.Fatalf("no ConfigMap %s", name)
	return nil
}

// flagValue is the value of --name=VALUE in args, and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func volume(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	t.Fatalf("no volume %q", name)
	return nil
}

func mount(t *testing.T, c *corev1.Container, name string) *corev1.VolumeMount {
	t.Helper()
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	t.Fatalf("container %s mounts no %q", c.Name, name)
	return nil
}

func containerPort(t *testing.T, c *corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return 0
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkPod holds for every pod the chart renders: each container has a
// memory limit, no privilege unless allowed, mounts only volumes the pod
// has, and names in $(VAR) only variables it defines before.
func checkPod(t *testing.T, what string, spec *corev1.PodSpec, privilegeAllowed bool) {
	t.Helper()
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		name := what + "/" + c.Name
		if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
			t.Errorf("%s: no memory limit", name)
		}
		for res, q := range c.Resources.Limits {
			if q.Sign() < 0 {
				t.Errorf("%s: negative %s limit %s", name, res, q.String())
			}
		}
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no securityContext", name)
		} else if !privilegeAllowed {
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s is privileged", name)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s may escalate privileges", name)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: capabilities %+v, want all dropped", name, sc.Capabilities)
			}
		}
		vols := map[string]bool{}
		for _, v := range spec.Volumes {
			vols[v.Name] = true
		}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				t.Errorf("%s mounts %q, which the pod does not have", name, m.Name)
			}
		}
		defined := map[string]bool{}
		for _, e := range c.Env {
			defined[e.Name] = true
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			for _, m := range envRef.FindAllStringSubmatch(a, -1) {
				if !defined[m[1]] {
					t.Errorf("%s: argument %q names $(%s), which is not in its env", name, a, m[1])
				}
			}
		}
	}
}

// checkDaemonSet checks what the daemon needs on a node.
func checkDaemonSet(t *testing.T, r rendered, dataDir string) {
	t.Helper()
	ds := r.daemonSet(t)
	spec := &ds.Spec.Template.Spec
	checkPod(t, "daemonset", spec, false)
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q: want the node's network and cluster DNS", spec.HostNetwork, spec.DNSPolicy)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	for _, taint := range []string{"nvidia.com/gpu", "aws.amazon.com/neuron"} {
		if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
			return tl.Key == taint && tl.Operator == corev1.TolerationOpExists
		}) {
			t.Errorf("no toleration for %s", taint)
		}
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "daemon" {
		t.Fatalf("args %q: want `daemon ...`", c.Args)
	}

	// The data directory: a hostPath mounted at the same path, given to
	// --data-dir.
	data := volume(t, spec, "data")
	if data.HostPath == nil || data.HostPath.Path != dataDir || data.HostPath.Type == nil || *data.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("data volume %+v, want hostPath %s (DirectoryOrCreate)", data.VolumeSource, dataDir)
	}
	if m := mount(t, c, "data"); m.MountPath != dataDir || m.ReadOnly {
		t.Errorf("data mounted at %s (read-only %v), want %s read-write", m.MountPath, m.ReadOnly, dataDir)
	}
	if v, _ := flagValue(c.Args, "data-dir"); v != dataDir {
		t.Errorf("--data-dir=%q, want %s", v, dataDir)
	}

	// containerd: its socket as a Socket hostPath, and certs.d.
	sock := volume(t, spec, "containerd-socket")
	if sock.HostPath == nil || sock.HostPath.Type == nil || *sock.HostPath.Type != corev1.HostPathSocket {
		t.Errorf("containerd socket volume %+v, want hostPath type Socket", sock.VolumeSource)
	} else if v, _ := flagValue(c.Args, "containerd"); v != "unix://"+sock.HostPath.Path || mount(t, c, "containerd-socket").MountPath != sock.HostPath.Path {
		t.Errorf("--containerd=%q with the socket %s", v, sock.HostPath.Path)
	}
	certs := volume(t, spec, "containerd-certs")
	if certs.HostPath == nil || certs.HostPath.Path != "/etc/containerd/certs.d" {
		t.Errorf("certs.d volume %+v", certs.VolumeSource)
	}
	if v, _ := flagValue(c.Args, "registry-hosts-dir"); v != mount(t, c, "containerd-certs").MountPath {
		t.Errorf("--registry-hosts-dir=%q is not where certs.d is mounted", v)
	}

	// The cluster key: a Secret, read-only, mode 0400, given to the flag.
	key := volume(t, spec, "cluster-key")
	if key.Secret == nil || key.Secret.SecretName == "" || key.Secret.DefaultMode == nil || *key.Secret.DefaultMode != 0o400 {
		t.Errorf("cluster key volume %+v, want a Secret with defaultMode 0400", key.VolumeSource)
	}
	km := mount(t, c, "cluster-key")
	if !km.ReadOnly {
		t.Error("cluster key mounted read-write")
	}
	if v, _ := flagValue(c.Args, "cluster-key-file"); !strings.HasPrefix(v, km.MountPath+"/") {
		t.Errorf("--cluster-key-file=%q is not under the key's mount %s", v, km.MountPath)
	}

	// Node name and memory limit from the downward API.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME %+v, want the downward API's spec.nodeName", e)
	}
	if v, _ := flagValue(c.Args, "node-name"); v != "$(NODE_NAME)" {
		t.Errorf("--node-name=%q, want $(NODE_NAME)", v)
	}
	if e := env["GOMEMLIMIT"]; e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil || e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
		t.Errorf("GOMEMLIMIT %+v, want the memory limit", e)
	}

	// Probes on the metrics listener's port.
	metrics := containerPort(t, c, "metrics")
	if v, _ := flagValue(c.Args, "metrics-listen"); !strings.HasSuffix(v, fmt.Sprintf(":%d", metrics)) {
		t.Errorf("--metrics-listen=%q is not on the metrics port %d", v, metrics)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v, want an HTTP GET on the metrics port", name, p)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe on %s", c.ReadinessProbe.HTTPGet.Path)
	}

	// --join names the headless Service that lists every daemon.
	join, _ := flagValue(c.Args, "join")
	svcName, _, _ := strings.Cut(join, ".")
	var svc *corev1.Service
	for i := range r.services {
		if r.services[i].Name == svcName {
			svc = &r.services[i]
		}
	}
	if svc == nil {
		t.Fatalf("--join=%s names no Service of the chart", join)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("join Service %s: clusterIP %q, publishNotReadyAddresses %v; want headless, listing unready daemons", svc.Name, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	if want := fmt.Sprintf("%s.%s.svc:%d", svc.Name, namespace, containerPort(t, c, "gossip")); join != want {
		t.Errorf("--join=%s, want %s", join, want)
	}
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("join Service selects %s=%s, which the daemon pods do not carry", k, v)
		}
	}
}

// checkRouter checks the router Deployment and its config.
func checkRouter(t *testing.T, r rendered) {
	t.Helper()
	if len(r.deployments) != 1 {
		t.Fatalf("%d Deployments, want the router's", len(r.deployments))
	}
	d := &r.deployments[0]
	spec := &d.Spec.Template.Spec
	checkPod(t, "router", spec, false)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("router replicas %v, want 2", d.Spec.Replicas)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("router pod securityContext %+v, want a non-root user", sc)
	}
	c := &spec.Containers[0]
	for _, f := range []string{"join", "peer-listen", "gossip", "cluster-key-file", "config", "config-poll", "admin-token-file", "log-format"} {
		if _, ok := flagValue(c.Args, f); !ok {
			t.Errorf("router args %q lack --%s", c.Args, f)
		}
	}
	// The config is a ConfigMap mounted as a directory (a subPath mount
	// would never see an edit), and it is a config the router accepts.
	cfgPath, _ := flagValue(c.Args, "config")
	m := mount(t, c, "config")
	if m.SubPath != "" || filepath.Dir(cfgPath) != m.MountPath {
		t.Errorf("config mount %+v for --config=%s", m, cfgPath)
	}
	cm := r.configMap(t, volume(t, spec, "config").ConfigMap.Name)
	cfg := router.Defaults()
	if err := router.ParseConfig([]byte(cm.Data[filepath.Base(cfgPath)]), &cfg); err != nil {
		t.Errorf("router config in ConfigMap %s: %v", cm.Name, err)
	}
	// The admin listener requires the token, from a read-only Secret.
	tokenPath, _ := flagValue(c.Args, "admin-token-file")
	tm := mount(t, c, "admin-token")
	if tv := volume(t, spec, "admin-token"); tv.Secret == nil || !tm.ReadOnly || filepath.Dir(tokenPath) != tm.MountPath {
		t.Errorf("admin token volume %+v mounted %+v for --admin-token-file=%s", tv.VolumeSource, tm, tokenPath)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "admin" {
			t.Errorf("router %s probe %+v, want an HTTP GET on the admin port", name, p)
		}
	}
}

// TestChartValueSets lints and renders the chart with its defaults and with
// other value sets, and checks every object.
func TestChartValueSets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, r rendered)
	}{
		{"defaults", nil, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			checkRouter(t, r)
			checkRBAC(t, r, false)
			if slices.ContainsFunc(r.daemonSet(t).Spec.Template.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--discover-pods") }) {
				t.Error("pod endpoints on by default: they need list/watch on pods, which the defaults do not grant")
			}
			if len(r.podMonitors)+len(r.rules) > 0 {
				t.Error("monitoring objects rendered without the Prometheus Operator's API")
			}
		}},
		{"defaults with the Prometheus Operator", []string{"--api-versions", monitoringV}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			checkRouter(t, r)
			checkMonitoring(t, r)
		}},
		{"router off", []string{"--set", "router.enabled=false", "--api-versions", monitoringV}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			if len(r.deployments) != 0 || len(r.services) != 1 || len(r.configMaps) != 1 {
				t.Errorf("router off still renders %v", r.kinds)
			}
			if len(r.podMonitors) != 1 {
				t.Errorf("%d PodMonitors, want the daemon's", len(r.podMonitors))
			}
		}},
		{"custom data dir", []string{"--set", "daemon.dataDir=/mnt/k8s-disks/0/warmfleet"}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, "/mnt/k8s-disks/0/warmfleet")
			checkRouter(t, r)
		}},
		{"monitoring off", []string{"--set", "monitoring.enabled=false", "--api-versions", monitoringV}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			checkRouter(t, r)
			if len(r.podMonitors)+len(r.rules) > 0 || len(r.configMaps) != 1 {
				t.Errorf("monitoring off still renders %v", r.kinds)
			}
		}},
		{"caches from a node pool's ConfigMap", []string{"--set", "daemon.cachesConfigMap=pool-caches", "--set", "daemon.cachesPool=gpu-a"}, func(t *testing.T, r rendered) {
			if v, _ := flagValue(r.daemonSet(t).Spec.Template.Spec.Containers[0].Args, "apply-pool"); v != "gpu-a" {
				t.Errorf("--apply-pool=%q, want daemon.cachesPool", v)
			}
		}},
		{"caches from a ConfigMap", []string{"--set", "daemon.cachesConfigMap=fleet-caches"}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			spec := &r.daemonSet(t).Spec.Template.Spec
			if v := volume(t, spec, "caches"); v.ConfigMap == nil || v.ConfigMap.Name != "fleet-caches" {
				t.Errorf("caches volume %+v, want the ConfigMap fleet-caches", v.VolumeSource)
			}
			c := &spec.Containers[0]
			if !slices.Contains(c.Args, "--apply-dir=/etc/warmfleet/caches") ||
				!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "caches" && m.MountPath == "/etc/warmfleet/caches" && m.ReadOnly
				}) {
				t.Errorf("daemon args %q, mounts %+v: want --apply-dir on the mounted ConfigMap", c.Args, c.VolumeMounts)
			}
		}},
		{"example inference", []string{"--set", "exampleInference.enabled=true", "--set", "image.pullPolicy=Always",
			"--set", "imagePullSecrets[0].name=regcred", "--set", "exampleInference.waitTimeout=15m"}, func(t *testing.T, r rendered) {
			ex := exampleInference(t, r)
			pref := ex.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
			// The key the daemon's labeler writes for the model, value ready.
			want := corev1.NodeSelectorRequirement{Key: nodelabels.ModelKey("llama-3-70b"), Operator: corev1.NodeSelectorOpIn, Values: []string{nodelabels.ReadyValue}}
			if len(pref) != 1 || len(pref[0].Preference.MatchExpressions) != 1 || !equalJSON(pref[0].Preference.MatchExpressions[0], want) {
				t.Errorf("example affinity %+v, want a preference for %+v", pref, want)
			}
			if ex.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				t.Error("example requires warm nodes: cold ones must stay allowed")
			}
			if len(ex.InitContainers) != 1 {
				t.Fatalf("example initContainers %+v, want `warmfleet cache wait --local`", ex.InitContainers)
			}
			ic := ex.InitContainers[0]
			if !slices.Equal(ic.Args[:3], []string{"cache", "wait", "--local"}) || ic.Args[len(ic.Args)-1] != "llama-3-70b" {
				t.Errorf("initContainer args %q, want `cache wait --local ... llama-3-70b`", ic.Args)
			}
			if v, _ := flagValue(ic.Args, "timeout"); v != "15m" {
				t.Errorf("--timeout=%q, want exampleInference.waitTimeout", v)
			}
			if ic.ImagePullPolicy != corev1.PullAlways || len(ex.ImagePullSecrets) != 1 || ex.ImagePullSecrets[0].Name != "regcred" {
				t.Errorf("initContainer pull policy %q, pod pull secrets %+v; want image.pullPolicy and imagePullSecrets", ic.ImagePullPolicy, ex.ImagePullSecrets)
			}
			// The API socket the initContainer dials is the daemon's.
			api, _ := flagValue(ic.Args, "api")
			dsAPI, _ := flagValue(r.daemonSet(t).Spec.Template.Spec.Containers[0].Args, "api")
			if api != dsAPI || "unix://"+mount(t, &ic, "warmfleet-api").MountPath+"/api.sock" != api {
				t.Errorf("initContainer --api=%s, daemon --api=%s", api, dsAPI)
			}
			initOnly := ex.DeepCopy()
			initOnly.Containers = nil
			checkPod(t, "example", initOnly, false)
			// The pod's annotations make it an endpoint of its model for the
			// daemon beside it (--discover-pods), once it runs and is Ready.
			dep := r.deployments[slices.IndexFunc(r.deployments, func(d appsv1.Deployment) bool { return strings.HasSuffix(d.Name, "-inference-example") })]
			pod := &corev1.Pod{ObjectMeta: dep.Spec.Template.ObjectMeta, Spec: *ex.DeepCopy()}
			pod.Name, pod.Namespace, pod.Spec.NodeName = "ex-0", namespace, "gpu-1"
			pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			if ep, st, ok, err := podendpoints.FromPod(pod, "gpu-1"); !ok || err != nil || st != podendpoints.Ready ||
				ep.URL != "http://10.0.0.7:8000" || ep.Model != "llama-3-70b" {
				t.Errorf("example pod as an endpoint: %+v %q %v %v; want http://10.0.0.7:8000 for llama-3-70b", ep, st, ok, err)
			}
		}},
		{"example inference, defaults", []string{"--set", "exampleInference.enabled=true"}, func(t *testing.T, r rendered) {
			ex := exampleInference(t, r)
			if len(ex.InitContainers) != 1 || len(ex.ImagePullSecrets) != 0 {
				t.Errorf("initContainers %d, pull secrets %+v; want the wait and no secrets", len(ex.InitContainers), ex.ImagePullSecrets)
			}
			if _, ok := flagValue(ex.InitContainers[0].Args, "timeout"); ok {
				t.Errorf("initContainer args %q: no --timeout by default", ex.InitContainers[0].Args)
			}
		}},
		{"node labels with events", []string{"--set", "daemon.nodeLabels.events=true"}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			checkRBAC(t, r, true)
			if !slices.Contains(r.daemonSet(t).Spec.Template.Spec.Containers[0].Args, "--node-events") {
				t.Error("events on, but the daemon lacks --node-events")
			}
		}},
		{"pod endpoints in one namespace", []string{"--set", "daemon.podEndpoints.enabled=true", "--set", "daemon.podEndpoints.namespace=infer"}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			checkPodRBAC(t, r, "infer")
			checkRBAC(t, withoutPodRBAC(r), false)
		}},
		{"pod endpoints in all namespaces", []string{"--set", "daemon.podEndpoints.enabled=true", "--set", "daemon.nodeLabels.events=true"}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			checkPodRBAC(t, r, "")
			checkRBAC(t, withoutPodRBAC(r), true)
		}},
		{"pod endpoints without node labels", []string{"--set", "daemon.podEndpoints.enabled=true", "--set", "daemon.nodeLabels.enabled=false"}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			checkPodRBAC(t, r, "")
			if rest := withoutPodRBAC(r); len(rest.clusterRoles)+len(rest.roles) > 0 {
				t.Errorf("node labels off, yet RBAC %v", r.kinds)
			}
			if !slices.Contains(r.daemonSet(t).Spec.Template.Spec.Containers[0].Args, "--kubernetes=false") {
				t.Error("node labels off, but the daemon lacks --kubernetes=false")
			}
		}},
		{"node labels off", []string{"--set", "daemon.nodeLabels.enabled=false"}, func(t *testing.T, r rendered) {
			checkDaemonSet(t, r, defaultData)
			spec := r.daemonSet(t).Spec.Template.Spec
			if len(r.clusterRoles)+len(r.clusterBindings)+len(r.roles)+len(r.roleBindings) > 0 || !slices.Contains(spec.Containers[0].Args, "--kubernetes=false") ||
				spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("node labels off: RBAC %v, args %q, automount %v; want no RBAC, --kubernetes=false, no token", r.kinds, spec.Containers[0].Args, spec.AutomountServiceAccountToken)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lint := append([]string{"lint", "--strict", chartDir}, tc.args...)
			lint = slices.DeleteFunc(lint, func(a string) bool { return a == "--api-versions" || a == monitoringV })
			if out, err := exec.Command(testenv.Bin(t, "helm"), lint...).CombinedOutput(); err != nil {
				t.Fatalf("helm %v: %v\n%s", lint, err, out)
			}
			tc.check(t, decode(t, mustTemplate(t, tc.args...)))
		})
	}
}

func exampleInference(t *testing.T, r rendered) *corev1.PodSpec {
	t.Helper()
	i := slices.IndexFunc(r.deployments, func(d appsv1.Deployment) bool { return strings.HasSuffix(d.Name, "-inference-example") })
	if len(r.deployments) != 2 || i < 0 {
		t.Fatalf("%d Deployments, want the router's and the example's", len(r.deployments))
	}
	return &r.deployments[i].Spec.Template.Spec
}

func equalJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// checkRBAC: with node labels on, the chart grants the daemon's service
// account exactly the rules of deploy/kubernetes/rbac.yaml, which
// TestRBACIsLeastPrivilege (internal/kube/nodelabels) checks against the
// labeler's calls (the Events Role only with events on), and only the
// daemon's pods mount the token.
func checkRBAC(t *testing.T, r rendered, events bool) {
	t.Helper()
	var want rendered
	b, err := os.ReadFile("kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want = decode(t, b)
	if len(r.clusterRoles) != 1 || len(r.clusterBindings) != 1 || !equalJSON(r.clusterRoles[0].Rules, want.clusterRoles[0].Rules) {
		t.Fatalf("ClusterRoles %+v, bindings %d; want one with the rules of rbac.yaml %+v", r.clusterRoles, len(r.clusterBindings), want.clusterRoles[0].Rules)
	}
	sa := r.serviceAccounts[0].Name
	bindings := []rbacv1.RoleRef{r.clusterBindings[0].RoleRef}
	subjects := [][]rbacv1.Subject{r.clusterBindings[0].Subjects}
	if events {
		if len(r.roles) != 1 || len(r.roleBindings) != 1 || r.roles[0].Namespace != nodelabels.EventNamespace || !equalJSON(r.roles[0].Rules, want.roles[0].Rules) {
			t.Fatalf("Roles %+v, want one in %s with the rules of rbac.yaml", r.roles, nodelabels.EventNamespace)
		}
		bindings = append(bindings, r.roleBindings[0].RoleRef)
		subjects = append(subjects, r.roleBindings[0].Subjects)
		if r.roleBindings[0].RoleRef.Name != r.roles[0].Name {
			t.Errorf("RoleBinding binds %s, not the Role %s", r.roleBindings[0].RoleRef.Name, r.roles[0].Name)
		}
	} else if len(r.roles)+len(r.roleBindings) > 0 {
		t.Errorf("events off, yet %d Roles and %d RoleBindings", len(r.roles), len(r.roleBindings))
	}
	if bindings[0].Name != r.clusterRoles[0].Name {
		t.Errorf("ClusterRoleBinding binds %s, not the ClusterRole %s", bindings[0].Name, r.clusterRoles[0].Name)
	}
	for _, s := range subjects {
		if len(s) != 1 || s[0].Kind != "ServiceAccount" || s[0].Name != sa || s[0].Namespace != namespace {
			t.Errorf("binding subjects %+v, want the ServiceAccount %s/%s", s, namespace, sa)
		}
	}
	ds := r.daemonSet(t).Spec.Template.Spec
	if ds.ServiceAccountName != sa || ds.AutomountServiceAccountToken == nil || !*ds.AutomountServiceAccountToken {
		t.Errorf("daemon pods: service account %q, automount %v; want %s with its token", ds.ServiceAccountName, ds.AutomountServiceAccountToken, sa)
	}
	if a := r.serviceAccounts[0].AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("ServiceAccount automount %v: want false, so the router's pods get no token", a)
	}
	for _, d := range r.deployments {
		if a := d.Spec.Template.Spec.AutomountServiceAccountToken; a != nil && *a {
			t.Errorf("Deployment %s mounts the token", d.Name)
		}
	}
	if slices.ContainsFunc(ds.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--kubernetes") }) {
		t.Errorf("daemon args %q: with node labels on, the daemon finds the cluster by itself", ds.Containers[0].Args)
	}
}

// podRBACName names the pod endpoints' Role or ClusterRole and binding.
const podRBACName = release + "-pod-endpoints"

// checkPodRBAC: with pod endpoints on, the daemon's service account gets
// the rules of deploy/kubernetes/rbac-pod-endpoints.yaml (which
// TestRBACIsLeastPrivilege in internal/kube/podendpoints holds to the
// watcher's calls): in a Role of ns when one is given, else in a
// ClusterRole; the daemon mounts the token and gets the matching flags.
func checkPodRBAC(t *testing.T, r rendered, ns string) {
	t.Helper()
	b, err := os.ReadFile("kubernetes/rbac-pod-endpoints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := decode(t, b).clusterRoles[0].Rules
	var rules []rbacv1.PolicyRule
	var ref rbacv1.RoleRef
	var subjects []rbacv1.Subject
	found := 0
	for _, cr := range r.clusterRoles {
		if cr.Name == podRBACName && ns == "" {
			rules, found = cr.Rules, found+1
		}
	}
	for _, ro := range r.roles {
		if ro.Name == podRBACName && ns != "" && ro.Namespace == ns {
			rules, found = ro.Rules, found+1
		}
	}
	for _, b := range r.clusterBindings {
		if b.Name == podRBACName && ns == "" {
			ref, subjects, found = b.RoleRef, b.Subjects, found+1
		}
	}
	for _, b := range r.roleBindings {
		if b.Name == podRBACName && ns != "" && b.Namespace == ns {
			ref, subjects, found = b.RoleRef, b.Subjects, found+1
		}
	}
	wantKind := "ClusterRole"
	if ns != "" {
		wantKind = "Role"
	}
	if found != 2 || !equalJSON(rules, want) || ref.Kind != wantKind || ref.Name != podRBACName {
		t.Fatalf("pod endpoints RBAC: %d objects, rules %+v, binding to %+v; want a %s (and binding) in %q with the rules of rbac-pod-endpoints.yaml %+v",
			found, rules, ref, wantKind, ns, want)
	}
	sa := r.serviceAccounts[0].Name
	if len(subjects) != 1 || subjects[0].Kind != "ServiceAccount" || subjects[0].Name != sa || subjects[0].Namespace != namespace {
		t.Errorf("binding subjects %+v, want the ServiceAccount %s/%s", subjects, namespace, sa)
	}
	ds := r.daemonSet(t).Spec.Template.Spec
	if ds.AutomountServiceAccountToken == nil || !*ds.AutomountServiceAccountToken {
		t.Error("daemon pods do not mount the token the watch needs")
	}
	args := ds.Containers[0].Args
	v, ok := flagValue(args, "discover-pods-namespace")
	if !slices.Contains(args, "--discover-pods") || ok != (ns != "") || v != ns {
		t.Errorf("daemon args %q: want --discover-pods and --discover-pods-namespace=%q", args, ns)
	}
}

// withoutPodRBAC is r without the pod endpoints' RBAC objects, for
// checkRBAC to see the node labels' alone.
func withoutPodRBAC(r rendered) rendered {
	r.clusterRoles = slices.DeleteFunc(slices.Clone(r.clusterRoles), func(x rbacv1.ClusterRole) bool { return x.Name == podRBACName })
	r.clusterBindings = slices.DeleteFunc(slices.Clone(r.clusterBindings), func(x rbacv1.ClusterRoleBinding) bool { return x.Name == podRBACName })
	r.roles = slices.DeleteFunc(slices.Clone(r.roles), func(x rbacv1.Role) bool { return x.Name == podRBACName })
	r.roleBindings = slices.DeleteFunc(slices.Clone(r.roleBindings), func(x rbacv1.RoleBinding) bool { return x.Name == podRBACName })
	return r
}

// TestChartRejectsBadValues: values that cannot work fail at helm template
// with a message naming the value.
func TestChartRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   []string
		value string // what the message must name
	}{
		{"no data dir", []string{"daemon.dataDir="}, "dataDir"},
		{"relative data dir", []string{"daemon.dataDir=warmfleet"}, "dataDir"},
		{"no key Secret", []string{"clusterKey.secretName="}, "clusterKey"},
		{"no admin token Secret", []string{"router.adminToken.secretName="}, "adminToken"},
		{"negative memory limit", []string{"daemon.resources.limits.memory=-2Gi"}, "memory"},
		{"negative cpu request", []string{"router.resources.requests.cpu=-1"}, "cpu"},
		{"root router", []string{"router.runAsUser=0"}, "runAsUser"},
		{"bad port", []string{"daemon.ports.metrics=70000"}, "metrics"},
		{"unknown value", []string{"daemon.dataDirectory=/x"}, "dataDirectory"},
		{"router without daemons", []string{"daemon.enabled=false"}, "daemon.enabled"},
		{"example model with a hashed label key", []string{"exampleInference.enabled=true", "exampleInference.model=a--b"}, "exampleInference.model"},
		{"bad wait timeout", []string{"exampleInference.waitTimeout=soon"}, "waitTimeout"},
		{"bad pod endpoints namespace", []string{"daemon.podEndpoints.namespace=Infer_NS"}, "namespace"},
		{"bad caches pool", []string{"daemon.cachesPool=GPU A"}, "cachesPool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, err := helmTemplate(t, args...)
			if err == nil {
				t.Fatalf("helm template accepted %v", tc.set)
			}
			if !strings.Contains(err.Error(), tc.value) {
				t.Errorf("error does not name %s: %v", tc.value, err)
			}
		})
	}
}

// TestRenderedManifestIsCurrent: deploy/kubernetes holds the chart rendered
// with its defaults. Regenerate with:
//
//	bin/helm template warmfleet deploy/helm/warmfleet --namespace warmfleet > deploy/kubernetes/warmfleet.yaml
func TestRenderedManifestIsCurrent(t *testing.T) {
	want := mustTemplate(t)
	got, err := os.ReadFile("kubernetes/warmfleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("deploy/kubernetes/warmfleet.yaml differs from `helm template` of the chart; regenerate it (see the test's comment)")
	}
}

// TestDashboardCopiesMatch: the dashboard under deploy/grafana is the one
// the chart ships.
func TestDashboardCopiesMatch(t *testing.T) {
	a, err := os.ReadFile("grafana/warmfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "dashboards/warmfleet.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("deploy/grafana/warmfleet.json and the chart's dashboards/warmfleet.json differ: copy one over the other")
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var metricName = regexp.MustCompile(`\bwarmfleet_[a-z0-9_]+`)

// registeredMetrics are the metric names the product's code registers,
// from the string literals of its non-test sources.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	root := testenv.RepoRoot()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && (rel == "integration" || rel == "deploy" || strings.HasPrefix(d.Name(), ".") && rel != ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`"(warmfleet_[a-z0-9_]+)"`).FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// checkMetricNames fails for a name in expr that no code registers
// (histograms' _bucket, _sum and _count series count as their family).
func checkMetricNames(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	for _, n := range metricName.FindAllString(expr, -1) {
		base := n
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suf); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			t.Errorf("%s uses %s, which no code registers", where, n)
		}
	}
}

// TestDashboardUsesRealMetrics: every panel queries metrics the code
// exports, and the dashboard covers what the issue asks.
func TestDashboardUsesRealMetrics(t *testing.T) {
	b, err := os.ReadFile("grafana/warmfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	known := registeredMetrics(t)
	var all []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkMetricNames(t, "panel "+p.Title, tg.Expr, known)
			all = append(all, tg.Expr)
		}
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{
		"warmfleet_cache_bytes", "warmfleet_cache_size_bytes", // warm-up progress
		"warmfleet_s3_bytes_total", "warmfleet_peer_bytes_total", // S3 vs peers
		"warmfleet_cache_state", "warmfleet_cache_available_bytes", // states, free NVMe
		`reason="hit"`, "warmfleet_router_ttfb_seconds_bucket", "warmfleet_router_backend_inflight",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("no panel queries %s", want)
		}
	}
}

// checkMonitoring checks the Prometheus Operator objects and the dashboard
// ConfigMap.
func checkMonitoring(t *testing.T, r rendered) {
	t.Helper()
	if len(r.podMonitors) != 2 || len(r.rules) != 1 {
		t.Fatalf("%d PodMonitors and %d PrometheusRules, want 2 and 1", len(r.podMonitors), len(r.rules))
	}
	ds := r.daemonSet(t)
	for _, pm := range r.podMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		port := pm.Spec.PodMetricsEndpoints[0].Port
		var pod *corev1.PodTemplateSpec
		if sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
			pod = &ds.Spec.Template
		}
		for i := range r.deployments {
			if sel.Matches(labels.Set(r.deployments[i].Spec.Template.Labels)) {
				pod = &r.deployments[i].Spec.Template
			}
		}
		if pod == nil {
			t.Errorf("PodMonitor %s selects no pod of the chart", pm.Name)
			continue
		}
		containerPort(t, &pod.Spec.Containers[0], port)
		if port == "admin" {
			auth := pm.Spec.PodMetricsEndpoints[0].Authorization
			if auth == nil || auth.Type != "Bearer" || auth.Credentials.Name != volume(t, &pod.Spec, "admin-token").Secret.SecretName {
				t.Errorf("router PodMonitor authorization %+v, want the admin token Secret", auth)
			}
		}
	}
	known := registeredMetrics(t)
	alerts := map[string]bool{}
	for _, g := range r.rules[0].Spec.Groups {
		for _, rule := range g.Rules {
			alerts[rule.Alert] = true
			checkMetricNames(t, "alert "+rule.Alert, rule.Expr, known)
			if strings.Contains(rule.Expr, "{{") {
				t.Errorf("alert %s: unrendered template in %q", rule.Alert, rule.Expr)
			}
		}
	}
	for _, a := range []string{"WarmfleetCacheFailed", "WarmfleetS3BytesAboveModelSize", "WarmfleetPeersBanned", "WarmfleetNodeLabelsFailing", "WarmfleetRouterErrors", "WarmfleetRouterNoReadyEndpoint"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
	want, err := os.ReadFile("grafana/warmfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.configMap(t, release+"-dashboard").Data["warmfleet.json"]; got != strings.TrimRight(string(want), "\n") {
		t.Error("the dashboard ConfigMap does not hold deploy/grafana/warmfleet.json")
	}
}
