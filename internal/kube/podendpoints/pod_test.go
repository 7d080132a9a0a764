package podendpoints

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const node = "gpu-1"

// newPod is a Running, Ready pod on node with the given annotations.
func newPod(name, ip string, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "infer", Annotations: ann},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8000}, {Name: "metrics-udp", ContainerPort: 9000, Protocol: corev1.ProtocolUDP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func port(p string) map[string]string { return map[string]string{AnnotationPort: p} }

func TestFromPod(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name    string
		pod     func(p *corev1.Pod)
		ann     map[string]string
		wantOK  bool
		want    State
		wantURL string
		wantErr string
	}{
		{"not annotated", nil, map[string]string{"other": "x"}, false, "", "", ""},
		{"another node's", func(p *corev1.Pod) { p.Spec.NodeName = "gpu-2" }, port("8000"), false, "", "", ""},
		{"ready, numeric port", nil, port("8000"), true, Ready, "http://10.1.2.3:8000", ""},
		{"ready, named port", nil, port("http"), true, Ready, "http://10.1.2.3:8000", ""},
		{"ready, IPv6", func(p *corev1.Pod) { p.Status.PodIP = "fd00::7" }, port("8000"), true, Ready, "http://[fd00::7]:8000", ""},
		{"model given", nil, map[string]string{AnnotationPort: "8000", AnnotationModel: "meta/llama-3-8b"}, true, Ready, "http://10.1.2.3:8000", ""},
		{"readiness probe failing", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, port("8000"), true, NotReady, "", ""},
		{"no Ready condition yet", func(p *corev1.Pod) { p.Status.Conditions = nil }, port("8000"), true, NotReady, "", ""},
		{"pending", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }, port("8000"), true, NotReady, "", ""},
		{"terminating", func(p *corev1.Pod) { p.DeletionTimestamp = &now }, port("8000"), true, NotReady, "", ""},
		{"no IP", func(p *corev1.Pod) { p.Status.PodIP = "" }, port("8000"), true, NotReady, "", ""},
		{"garbage IP", func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.1/8" }, port("8000"), true, NotReady, "", ""},
		// Hostile or mistaken annotations: Invalid, with a clear error.
		{"empty port", nil, port(""), true, Invalid, "", "is empty"},
		{"port 0", nil, port("0"), true, Invalid, "", `"0": want a port 1-65535`},
		{"port too big", nil, port("70000"), true, Invalid, "", "want a port 1-65535"},
		{"port overflow", nil, port("99999999999999999999999"), true, Invalid, "", "want a port 1-65535"},
		{"port with junk", nil, port("8000; rm -rf /"), true, Invalid, "", "want a port 1-65535"},
		{"negative port", nil, port("-1"), true, Invalid, "", "no TCP container port"},
		{"unknown port name", nil, port("grpc"), true, Invalid, "", `"grpc": no TCP container port`},
		{"UDP port name", nil, port("metrics-udp"), true, Invalid, "", "no TCP container port"},
		{"huge port value", nil, port(strings.Repeat("é", 100000)), true, Invalid, "", "... (200000 bytes)"},
		{"bad model", nil, map[string]string{AnnotationPort: "8000", AnnotationModel: "../../etc/passwd"}, true, Invalid, "", AnnotationModel},
		{"empty model", nil, map[string]string{AnnotationPort: "8000", AnnotationModel: ""}, true, Invalid, "", AnnotationModel},
		{"invalid even when not ready", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }, port("x"), true, Invalid, "", "no TCP container port"},
		{"speed given", nil, map[string]string{AnnotationPort: "8000", AnnotationSpeed: "2.5"}, true, Ready, "http://10.1.2.3:8000", ""},
		{"speed not a number", nil, map[string]string{AnnotationPort: "8000", AnnotationSpeed: "fast"}, true, Invalid, "", AnnotationSpeed},
		{"speed NaN", nil, map[string]string{AnnotationPort: "8000", AnnotationSpeed: "NaN"}, true, Invalid, "", "want a number 1/64..64"},
		{"speed 0", nil, map[string]string{AnnotationPort: "8000", AnnotationSpeed: "0"}, true, Invalid, "", "want a number 1/64..64"},
		{"speed 1e9", nil, map[string]string{AnnotationPort: "8000", AnnotationSpeed: "1e9"}, true, Invalid, "", "want a number 1/64..64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod("vllm-0", "10.1.2.3", tc.ann)
			if tc.pod != nil {
				tc.pod(p)
			}
			ep, st, ok, err := FromPod(p, node)
			if ok != tc.wantOK || st != tc.want || ep.URL != tc.wantURL {
				t.Fatalf("FromPod = %+v, %q, %v, %v; want url %q, state %q, ok %v", ep, st, ok, err, tc.wantURL, tc.want, tc.wantOK)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("FromPod: %v", err)
				}
				if st == Ready && (ep.Pod != "infer/vllm-0" || ep.Model != tc.ann[AnnotationModel] || (ep.Speed != 0) != (tc.ann[AnnotationSpeed] != "")) {
					t.Errorf("endpoint %+v", ep)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "pod infer/vllm-0") {
				t.Fatalf("FromPod error %v, want one naming the pod and %q", err, tc.wantErr)
			}
			if len(err.Error()) > 1024 {
				t.Errorf("error of %d bytes: a hostile value must be cut", len(err.Error()))
			}
		})
	}
}
