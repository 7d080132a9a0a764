// Package manifest reads the files of `warmfleet apply -f FILE|DIR|-`:
// declarative model caches, image caches and endpoints, and plans what
// applying them changes.
//
// # Schema
//
// Every document (several per file, separated by ---) has the same four
// parts; nothing else is accepted:
//
//	apiVersion: warmfleet.io/v1alpha1
//	kind: ModelCache
//	metadata: {name: llama-3-8b}
//	spec: {source: "s3://models/llama-3-8b/", revision: r1, selector: {gpu: h100}, nodes: 4, pin: true, priority: 10}
//	---
//	apiVersion: warmfleet.io/v1alpha1
//	kind: ImageCache
//	metadata: {name: vllm}        # the claim's owner: the deployment that wants it
//	spec: {image: "ghcr.io/acme/vllm:v0.6.0", selector: {gpu: h100}}
//	---
//	apiVersion: warmfleet.io/v1alpha1
//	kind: Endpoint
//	metadata: {name: llama-local}
//	spec: {model: llama-3-8b, url: "http://127.0.0.1:8000"}
//
// A ModelCache's name is the model name. An ImageCache's name is the
// image claim's owner (the CLI's --owner), so one image wanted by two
// deployments is two documents. An Endpoint is identified by its URL; its
// name only tells documents apart. A ModelCache's pin and priority are the
// capacity rules of package daemon: a pinned cache is never evicted, and a
// cache may evict only caches of its priority or lower.
//
// Decoding is strict and reports every problem with its line: unknown
// fields at any level, an unknown kind, another apiVersion, a field given
// twice, a value of the wrong type, a name used twice within a kind (or two
// Endpoints with one URL), and whatever the API's own validators refuse,
// so a file and the CLI accept the same things. Scalars are read as
// written: "revision: 1.10" is the string "1.10" and "zone: no" is "no".
// Inputs are bounded (MaxBytes, MaxDocuments).
//
// # Ownership and plans
//
// Everything apply creates records its owner: --owner, or by default the
// file's or directory's absolute path (DefaultOwner). MakePlan compares
// what the daemon holds with the documents and returns creates, updates and
// deletes: what the owner applied or what was made by hand (which apply
// adopts) may change; what another owner applied is a conflict, refused
// with every key and owner named. With prune, objects of this owner that
// the documents no longer name are deleted; nobody else's ever are.
// PlanDelete plans `delete -f`, refusing other owners' objects the same way.
// Plan.Diff prints a plan for a person.
package manifest
