// Package daemon wires a node's warmfleet daemon: the desired caches, the
// reconcile loop that moves the node's NVMe cache toward them, the durable
// state (bbolt; schema in state.go) and the local HTTP/JSON API.
//
// The reconcile loop decides in a pure function (plan) and acts at the
// edges: each model cache is fetched by its own goroutine, which lists the
// source, keeps the files the spec's include/exclude patterns ask for,
// downloads only missing parts (recording each finished part so a restart
// resumes), verifies every file against the digest its origin holds and
// publishes the revision atomically. A cache is reported ready only after
// that.
//
// The daemon reads sources through origin.Origin, one per scheme
// (origin.Mux: s3:// through internal/s3origin, hf:// through
// internal/hforigin, magnet: and torrent+...:// through
// internal/torrentorigin), and imports none: every origin pins what it
// lists (ETag and version, the Hub commit, the torrent's info hash), so a
// changed source is a new revision (RevisionID), never a mix.
//
// Published files are checked again (check.go): by stat at start and at
// each resync, by a full re-hash on request (Verify); a damaged cache goes
// back to the reconciler, not ready, and its damaged files are fetched
// again. A listing with another file set is acted upon only when the next
// one agrees (listing.go). A failure that cannot be saved (a full disk) is
// backed off in memory.
//
// With a swarm (Deps.Swarm, swarm.go) a revision's files are cut into
// shards, each read from S3 by one origin node and filled from it by the
// others. A node that sees no other member downloads directly, unless an
// earlier run began the revision through the swarm: every shard it opened
// left its layout (bucket shards) or its manifest (bucket manifests), so a
// restart resumes it cut the same way, with the pieces it verified. A
// member that holds the revision ready but serves a shard no manifest (it
// downloaded directly) is no origin for it: its followers rank the other
// members, one of which reads the shard from S3 for them.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmfleet/warmfleet/daemon/api"
	"github.com/warmfleet/warmfleet/desired"
	"github.com/warmfleet/warmfleet/gossip"
	"github.com/warmfleet/warmfleet/health"
	"github.com/warmfleet/warmfleet/nvme"
	"github.com/warmfleet/warmfleet/origin"
	"github.com/warmfleet/warmfleet/spec"
)

// Config is a daemon's configuration, validated by New.
type Config struct {
	NodeName string
	DataDir  string
	Labels   map[string]string
	// PartSize is the unit of resume: the download part size of the origin.
	PartSize int64
	// FileConcurrency is how many files of one model download at once.
	FileConcurrency int
	ReserveBytes    int64
	ReserveFraction float64
	// ResyncInterval is how often a ready cache re-lists its source; 0 = never.
	ResyncInterval time.Duration
	// ReconcileInterval bounds how long a change may wait for the loop.
	ReconcileInterval time.Duration
	// OldRevisionGrace is how long a model's previous revisions stay on disk
	// after an update, so inference servers that are still opening their
	// files can finish; 0 deletes them at once. A download that needs their
	// space deletes them earlier, oldest first.
	OldRevisionGrace time.Duration
	// StatFS reports the data dir's file system space; nil means statfs(2).
	StatFS  func(path string) (nvme.Space, error)
	Version string
	Logger  *slog.Logger
	// Clock is the time source; nil means time.Now.
	Clock func() time.Time
}

func (c *Config) validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data dir is required"))
	}
	if c.PartSize <= 0 {
		errs = append(errs, fmt.Errorf("part size %d: want > 0", c.PartSize))
	}
	if c.ResyncInterval < 0 || c.ReconcileInterval < 0 {
		errs = append(errs, errors.New("intervals must not be negative"))
	}
	if c.OldRevisionGrace < 0 {
		errs = append(errs, fmt.Errorf("old revision grace %v: want >= 0", c.OldRevisionGrace))
	}
	for k, v := range c.Labels {
		errs = append(errs, spec.ValidateLabel(k, v))
	}
	return errors.Join(errs...)
}

// Daemon is one node's daemon.
type Daemon struct {
	// Base gives the daemon its config, state, store, metrics and desired
	// state (and the methods Desired and Registry).
	*Base
	log     *slog.Logger
	clock   func() time.Time
	started time.Time // when New ran: a resume waits for the fleet to settle after it
	origins origin.Mux
	kick    chan struct{}
	// fleet is nil for a daemon without gossip.
	fleet Fleet
	// images is nil when the image cache is off.
	images *images
	// swarm is nil when model files come from S3 only.
	swarm *swarm

	// revMu orders the deletion of retired revisions against a fetch that
	// makes one of them current again, so a revision is never deleted as it
	// becomes current.
	revMu sync.Mutex
	// evictSem runs makeRoom one at a time, so two downloads do not evict
	// for the same bytes; a channel, so a canceled fetch stops waiting.
	evictSem chan struct{}
	// applyMu runs applies one at a time (Apply).
	applyMu sync.Mutex
	// applyDir is the watched directory; nil when none.
	applyDirMu sync.Mutex
	applyDir   *applyDir

	mu      sync.Mutex
	fetches map[string]*fetch
	// held holds the failures whose backoff could not be written to the
	// state (a full disk): the loop and the status read them from here.
	held map[string]cacheRecord
	// claimed holds the caches Verify works on: no fetch starts meanwhile.
	claimed map[string]spec.Spec
	wg      sync.WaitGroup
}

// holdRetry keeps a failed attempt's record (error, attempts, next try) in
// memory, for when the state cannot be written.
func (d *Daemon) holdRetry(rec cacheRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.held[rec.Spec.Name] = rec
}

// releaseRetry forgets a held failure: the state took a newer record.
func (d *Daemon) releaseRetry(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.held, name)
}

func (d *Daemon) heldRetry(name string) (cacheRecord, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, ok := d.held[name]
	return rec, ok
}

// Base is what a daemon and the parts built beside it share: the node's
// NVMe store, its state database, the fleet's desired state kept there and
// the metrics registry. It is opened first because gossip shares the
// desired state and the swarm and the image cache register their metrics,
// and the daemon is built on all of them (New).
type Base struct {
	cfg     Config
	state   *state
	store   *nvme.Store
	metrics *metrics
	desired *desired.State
	// oldBytes is the space each model's retired revisions take.
	oldBytes *prometheus.GaugeVec
}

// Open validates cfg and opens the node's store and state.
func Open(cfg Config) (*Base, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("daemon config: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.ReconcileInterval == 0 {
		cfg.ReconcileInterval = 10 * time.Second
	}
	if cfg.FileConcurrency == 0 {
		cfg.FileConcurrency = 2
	}
	store, err := nvme.Open(cfg.DataDir, nvme.Options{ReserveBytes: cfg.ReserveBytes, ReserveFraction: cfg.ReserveFraction, StatFS: cfg.StatFS})
	if err != nil {
		return nil, err
	}
	st, err := openState(filepath.Join(store.Dir(), "state.db"))
	if err != nil {
		store.Close()
		return nil, err
	}
	b := &Base{
		cfg: cfg, state: st, store: store, metrics: newMetrics(),
		oldBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "warmfleet_cache_old_revision_bytes",
			Help: "Bytes held by a model's previous revisions, kept for the grace period after an update.",
		}, []string{"model"}),
	}
	b.metrics.reg.MustRegister(b.oldBytes)
	desiredStore, err := desired.NewBoltStore(st.db, bucketDesired)
	if err == nil {
		b.desired, err = desired.New(context.Background(), desiredStore, desired.Options{
			NodeName: cfg.NodeName, Now: cfg.Clock, Logger: cfg.Logger.With("component", "desired"),
		})
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Desired is the fleet's desired state, for the gossip layer to share.
func (b *Base) Desired() *desired.State { return b.desired }

// Registry is the node's Prometheus registry, for other parts to add to.
func (b *Base) Registry() *health.Registry { return b.metrics.reg }

// Close closes the state and the store. A daemon built on b closes it.
func (b *Base) Close() error { return errors.Join(b.state.close(), b.store.Close()) }

// Deps are the parts a daemon works with beside its base; each is nil when
// off. Their owner starts them before New and stops them after Run returns.
type Deps struct {
	// Fleet makes the daemon a fleet member: specs target nodes fleet-wide
	// and its inventory is published. Nil runs the node alone.
	Fleet Fleet
	// Swarm makes the daemon fetch model files through the fleet's swarm:
	// each shard is pulled from S3 once, by one origin node, and the others
	// fill from peers. Needs a Fleet.
	Swarm Swarm
	// Images enables image pre-pulls.
	Images ImageCache
}

// New builds the daemon on b; origins fetch model files, each the sources
// of its scheme (a spec whose scheme has none fails its fetches, naming the
// schemes this daemon reads). Once New succeeds the daemon owns b (Close
// closes it); on an error b stays open.
func New(b *Base, origins origin.Mux, deps Deps) (*Daemon, error) {
	d := &Daemon{
		Base: b, log: b.cfg.Logger, clock: b.cfg.Clock, started: b.cfg.Clock(), origins: origins, fleet: deps.Fleet,
		kick: make(chan struct{}, 1), fetches: map[string]*fetch{}, evictSem: make(chan struct{}, 1),
		held: map[string]cacheRecord{}, claimed: map[string]spec.Spec{},
	}
	if deps.Swarm != nil {
		if err := d.useSwarm(deps.Swarm); err != nil {
			return nil, err
		}
	}
	if deps.Images != nil {
		d.useImageCache(deps.Images)
	}
	if err := d.restoreMetrics(); err != nil {
		return nil, err
	}
	if old, err := d.state.retired(); err == nil {
		d.setOldBytes(old)
	}
	return d, nil
}

func (d *Daemon) restoreMetrics() error {
	recs, err := d.state.records()
	if err != nil {
		return err
	}
	for name, rec := range recs {
		d.setMetrics(name, rec)
	}
	return nil
}

// setMetrics sets a cache's gauges from its record.
func (d *Daemon) setMetrics(name string, rec cacheRecord) {
	d.metrics.setState(name, rec.State)
	d.metrics.cacheTotal.WithLabelValues(name).Set(float64(rec.BytesTotal))
	if rec.State == api.StateReady {
		d.metrics.cacheBytes.WithLabelValues(name).Set(float64(rec.BytesTotal))
	}
}

// setStoredMetrics sets a cache's gauges from its stored record again, after
// they moved ahead of a record that could not be written.
func (d *Daemon) setStoredMetrics(name string) {
	rec, found, err := d.state.record(name)
	if err != nil || !found {
		return
	}
	d.setMetrics(name, rec)
}

// Close stops every fetch and closes the base (state and store).
func (d *Daemon) Close() error {
	d.mu.Lock()
	for _, f := range d.fetches {
		f.cancel()
	}
	d.mu.Unlock()
	d.wg.Wait()
	return d.Base.Close()
}

// Run reconciles until ctx ends, then stops every fetch (progress is kept).
func (d *Daemon) Run(ctx context.Context) error {
	ticker := time.NewTicker(d.cfg.ReconcileInterval)
	defer ticker.Stop()
	progress := time.NewTicker(time.Second)
	defer progress.Stop()
	var fleetChanged <-chan struct{}
	if d.fleet != nil {
		fleetChanged = d.fleet.OnChange()
	}
	if err := d.checkPublished(); err != nil {
		d.log.Error("check cached files", "err", err)
	}
	if err := d.reseed(ctx); err != nil {
		d.log.Error("reopen cached shards for peers", "err", err)
	}
	for {
		if err := d.reconcile(ctx); err != nil {
			d.log.Error("reconcile", "err", err)
		}
		if !d.waitForWork(ctx, ticker.C, progress.C, fleetChanged) {
			break
		}
	}
	d.mu.Lock()
	for _, f := range d.fetches {
		f.cancel()
	}
	d.mu.Unlock()
	d.wg.Wait()
	return nil
}

// waitForWork blocks until something may need reconciling, publishing
// download progress to the fleet meanwhile; false means ctx ended.
func (d *Daemon) waitForWork(ctx context.Context, tick, progress <-chan time.Time, fleetChanged <-chan struct{}) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-progress:
			d.publishInventory()
			continue
		case <-tick:
		case <-d.kick:
		case <-d.desired.Changed():
		case <-fleetChanged:
		}
		return true
	}
}

// Kick asks the loop to reconcile now.
func (d *Daemon) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func (d *Daemon) reconcile(ctx context.Context) error {
	targeted := d.targeter()
	w := world{running: map[string]spec.Spec{}, now: d.now(), resync: d.cfg.ResyncInterval}
	for _, s := range d.desired.List() {
		if s.Kind == spec.KindModel && targeted(s) {
			w.desired = append(w.desired, s)
		}
	}
	defer d.publishInventory()
	// The records are read under d.mu with the running fetches and claims,
	// as one snapshot: a fetch writes its last record before it leaves
	// d.fetches (under d.mu), and a Verify claims before it writes and
	// writes before it lets go. Read apart, a fetch that failed between the
	// reads would look like one a restart interrupted (in progress, none
	// running) and start again at once, skipping its backoff.
	d.mu.Lock()
	recs, err := d.state.records()
	if err != nil {
		d.mu.Unlock()
		return err
	}
	w.records = recs
	for name, f := range d.fetches {
		w.running[name] = f.spec
	}
	maps.Copy(w.running, d.claimed)
	overlayHeld(recs, d.held)
	d.mu.Unlock()
	if avail, err := d.store.Available(); err == nil {
		d.metrics.available.Set(float64(avail))
	}
	errs := []error{d.reconcileImages(ctx, targeted)}
	if err := d.pruneRetired(0); err != nil {
		errs = append(errs, err)
	}
	for _, act := range plan(w) {
		switch act.kind {
		case actFetch:
			d.startFetch(ctx, act.spec)
		case actCancel:
			d.stopFetch(act.name, errors.New("spec changed"))
		case actRemove:
			errs = append(errs, d.removeCache(act.name))
		}
	}
	return errors.Join(errs...)
}

func (d *Daemon) startFetch(ctx context.Context, s spec.Spec) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &fetch{d: d, spec: s, log: d.log.With("model", s.Name), cancel: cancel, exited: make(chan struct{})}
	d.mu.Lock()
	if _, ok := d.claimed[s.Name]; ok {
		// Claimed since the loop's snapshot (an eviction or a Verify):
		// the pass after the claim ends decides again.
		d.mu.Unlock()
		cancel()
		return
	}
	d.fetches[s.Name] = f
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f.run(fctx)
		cancel()
		d.mu.Lock()
		if d.fetches[s.Name] == f {
			delete(d.fetches, s.Name)
		}
		d.mu.Unlock()
		d.Kick()
	}()
}

// stopFetch cancels a fetch and waits until it has let go of its files.
func (d *Daemon) stopFetch(name string, why error) {
	d.mu.Lock()
	f := d.fetches[name]
	d.mu.Unlock()
	if f == nil {
		return
	}
	f.log.Info("stopping fetch", "reason", why)
	f.cancel()
	<-f.exited
}

func (d *Daemon) removeCache(name string) error {
	d.stopFetch(name, errors.New("cache removed"))
	rec, found, err := d.state.record(name)
	if err != nil {
		found = false
	}
	if err := d.removeFiles(name, rec, found); err != nil {
		return err
	}
	if err := d.state.deleteRecord(name); err != nil {
		return err
	}
	d.releaseRetry(name)
	d.metrics.forget(name)
	d.oldBytes.DeleteLabelValues(name)
	d.log.Info("cache removed", "model", name)
	return nil
}

// removeFiles stops serving a cache's files to peers and deletes them, with
// the manifests of rec's revisions when found.
func (d *Daemon) removeFiles(name string, rec cacheRecord, found bool) error {
	if err := d.swarm.release(name, ""); err != nil {
		d.log.Warn("stop serving removed model", "model", name, "err", err)
	}
	if found {
		if err := d.state.deleteManifests(name, []string{rec.RevisionID, rec.Updating}, ""); err != nil {
			return err
		}
	}
	return d.store.Remove(name)
}

// AddCache records a model spec in the fleet's desired state.
func (d *Daemon) AddCache(ctx context.Context, s spec.Spec) error {
	if err := d.desired.Put(ctx, s); err != nil {
		return err
	}
	d.Kick()
	return nil
}

// RemoveCache drops a model from the fleet's desired state; every node's
// loop frees its space.
func (d *Daemon) RemoveCache(ctx context.Context, name string) (bool, error) {
	err := d.desired.Delete(ctx, spec.Spec{Kind: spec.KindModel, Name: name}.Key())
	if errors.Is(err, desired.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	d.Kick()
	return true, nil
}

// Caches reports every desired or cached model on this node.
func (d *Daemon) Caches() ([]api.CacheStatus, error) {
	desired := d.desired.List()
	recs, err := d.state.records()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	overlayHeld(recs, d.held)
	d.mu.Unlock()
	byName := map[string]api.CacheStatus{}
	targeted := d.targeter()
	members := d.members()
	targets := map[string][]string{}
	for _, s := range desired {
		if s.Kind != spec.KindModel {
			continue
		}
		rec, ok := recs[s.Name]
		// A record of other files (the source or revision changed) says
		// nothing of the desired ones: they are ready only once fetched,
		// though the old files stay served meanwhile.
		if !ok || !sameContent(rec.Spec, s) {
			rec = cacheRecord{Spec: s, State: api.StatePending}
		}
		byName[s.Name] = d.status(s, rec, targeted(s))
		targets[s.Name] = d.targetNodes(s, members, targeted(s))
	}
	for name, rec := range recs {
		if _, ok := byName[name]; !ok {
			byName[name] = d.status(rec.Spec, rec, false)
		}
	}
	out := make([]api.CacheStatus, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		st := byName[name]
		st.Nodes = nodeStatuses(name, members)
		st.TargetNodes = targets[name]
		st.ReadyNodes = readyNodes(st, d.fleet == nil)
		out = append(out, st)
	}
	return out, nil
}

// targetNodes are the nodes that must hold s: gossip's choice in a fleet,
// this node alone (when targeted) without one.
func (d *Daemon) targetNodes(s spec.Spec, members []gossip.Member, targeted bool) []string {
	if d.fleet != nil {
		return gossip.Targets(s, members)
	}
	if targeted {
		return []string{d.cfg.NodeName}
	}
	return nil
}

// readyNodes counts the target nodes that report the cache ready: from the
// fleet's inventories, or this node's own status when alone.
func readyNodes(st api.CacheStatus, alone bool) int {
	if alone {
		if st.Ready && len(st.TargetNodes) > 0 {
			return 1
		}
		return 0
	}
	n := 0
	for _, ns := range st.Nodes {
		if ns.Ready && slices.Contains(st.TargetNodes, ns.Node) {
			n++
		}
	}
	return n
}

// overlayHeld puts the failures held in memory over the records read from
// the state: they are newer, only unsaved.
func overlayHeld(recs, held map[string]cacheRecord) {
	for name, rec := range held {
		recs[name] = rec
	}
}

// sameContent reports whether two model specs ask for the same files;
// targets only decide which nodes hold them, and the capacity settings and
// the applier how they are kept.
func sameContent(a, b spec.Spec) bool {
	for _, s := range []*spec.Spec{&a, &b} {
		s.Targets, s.Pin, s.Priority, s.AppliedBy = spec.Targets{}, false, 0, ""
	}
	return a.Equal(b)
}

// Cache reports one model; found is false when it is neither desired nor cached.
func (d *Daemon) Cache(name string) (api.CacheStatus, bool, error) {
	all, err := d.Caches()
	if err != nil {
		return api.CacheStatus{}, false, err
	}
	for _, c := range all {
		if c.Name == name {
			return c, true, nil
		}
	}
	return api.CacheStatus{}, false, nil
}

func (d *Daemon) status(s spec.Spec, rec cacheRecord, targeted bool) api.CacheStatus {
	st := api.CacheStatus{
		Name: s.Name, Source: s.Source, Revision: s.Revision, RevisionID: rec.RevisionID, State: rec.State,
		Files: len(rec.Files), BytesDone: rec.BytesDone, BytesTotal: rec.BytesTotal, Error: rec.Error,
		Attempts: rec.Attempts, UpdatedAt: rec.UpdatedAt, ReadyAt: rec.ReadyAt, Targets: s.Targets,
		NeedsAction: rec.NeedsAction, FilesChanged: rec.FilesChanged, Commit: pinnedCommit(s.Source, rec.Files),
		Pin: s.Pin, Priority: s.Priority, AppliedBy: s.AppliedBy, Space: rec.Space,
	}
	if rec.Error != "" {
		st.NextTry = rec.NextTry
	}
	d.mu.Lock()
	f := d.fetches[s.Name]
	d.mu.Unlock()
	if f != nil && rec.State != api.StateReady {
		st.BytesDone = f.progress()
	}
	if rec.State == api.StateReady && rec.Path != "" {
		st.Ready, st.Path = true, rec.Path
		if st.BytesDone < st.BytesTotal && f == nil {
			st.BytesDone = st.BytesTotal
		}
	}
	if !targeted && rec.State == api.StatePending {
		st.State = api.StateNotTargeted
	}
	return st
}

// Node describes this node.
func (d *Daemon) Node() (api.NodeInfo, error) {
	sp, err := d.store.Space()
	if err != nil {
		return api.NodeInfo{}, err
	}
	return api.NodeInfo{
		Name: d.cfg.NodeName, Version: d.cfg.Version, DataDir: d.store.Dir(), Labels: d.cfg.Labels,
		TotalBytes: sp.Total, FreeBytes: sp.Free, AvailableBytes: max(0, sp.Free-d.store.Reserve(sp)),
	}, nil
}

// AddOriginBytes counts bytes read from the origin of a source kind ("s3",
// "hf", "torrent"): the origins' OnBytes hook.
func (d *Daemon) AddOriginBytes(kind string, n int) {
	if kind == "s3" {
		d.metrics.s3Bytes.Add(int64(n))
	}
	d.metrics.originBytes.WithLabelValues(kind).Add(float64(n))
}

// sourceKind is the source kind metrics name a source by: its scheme, with
// magnet: and torrent+...:// both "torrent".
func sourceKind(source string) string {
	if k := origin.Scheme(source); k != "magnet" {
		return k
	}
	return "torrent"
}

// pinnedCommit is the commit the files of an hf:// source were read at,
// or the info hash of a torrent's (their VersionID, one for all), or ""
// for other sources.
func pinnedCommit(source string, files []fileRecord) string {
	if !pinsCommit(origin.Scheme(source)) || len(files) == 0 {
		return ""
	}
	for _, f := range files[1:] {
		if f.VersionID != files[0].VersionID {
			return ""
		}
	}
	return files[0].VersionID
}

// pinsCommit tells whether a source scheme pins every file to one version
// of the whole source: a Hub commit, a torrent's info hash.
func pinsCommit(scheme string) bool {
	return scheme == "hf" || scheme == "magnet" || scheme == "torrent"
}
