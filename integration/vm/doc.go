// Package vm tests power loss: the warmfleet daemon runs in a small Linux
// virtual machine whose data disk loses, at a power cut, what a real disk
// with a volatile write cache loses, and after every cut the machine boots
// again on what the disk kept and the daemon must not serve anything torn.
//
// # Why a virtual machine
//
// Killing the daemon (the chaos suite does) loses nothing it wrote: its
// writes sit in the kernel's page cache, which survives the process.
// Killing qemu alone is no better when the disk is a host file: the
// guest's writes already reached the host's page cache. Only a disk that
// holds back what the guest has not flushed can show a missing fsync, or a
// rename not made durable.
//
// # The power-cut model
//
// The guest's data disk (virtio-blk, ext4, mounted with the kernel's
// defaults: ordered data, barriers) is served by the test process itself
// over NBD (ServeNBD, the fixed newstyle handshake and simple replies to
// READ, WRITE, FLUSH, TRIM and DISC, requests bounded to 32 MiB). qemu's
// default write-back cache mode makes the guest see a volatile write cache,
// so every fsync in the guest ends as an NBD FLUSH. The Disk behind it
// keeps every write since the last FLUSH in a volatile layer (the guest
// reads its own writes through it); a FLUSH writes the layer back, in
// order, to the durable medium, an image file on the host (a full layer,
// 64 MiB, writes its oldest entries back on its own).
//
// A cut is armed at the n-th write or flush the disk receives: that
// request and every later one are not done and get no reply, the test
// kills qemu (SIGKILL), and PowerLoss decides what of the volatile layer
// reaches the medium: nothing (LoseAll), a random subset of the writes,
// in any order, each kept whole or torn at 512-byte sectors (KeepSome, as
// a disk that wrote part of its cache back in its own order leaves it,
// CrashMonkey and ALICE style), or everything (KeepAll). A flushed write
// always survives. A torn write can leave ext4's journal with a commit the
// guest's kernel finds corrupt and refuses to mount; the host then runs
// e2fsck -fy on the image and boots again, as a node's boot-time fsck
// would, and counts it (PowerCutResult.Fscks). Only unflushed writes tear,
// so nothing a returned fsync depended on is in what it discards.
//
// # The run (RunPowerCuts)
//
// RunPowerCuts is the one driver of the cuts: TestPowerCuts and
// TestPowerCutsImages call it, and so does `warmfleet-lab bench chaos
// --vm-cuts N --vm-image-cuts M` (its power_cuts and image_power_cuts
// figures: cuts, recovered, corrupt_ready, seconds_per_cut), which runs
// its own static binary in the guest as both the daemon and, through its
// vm-agent command, the agent. Model warm-ups and image pulls are two
// workloads of one loop (a cut adds an item, arms the disk, waits for the
// cut, boots again, audits everything added so far and waits for the
// item); what differs is each workload's add, arm, audit and check.
// One machine boots (the Debian cloud kernel, an initramfs of
// busybox-static and the virtio modules, the static warmfleet binary and
// the guest agent on a read-only tools disk) up to where its init waits for
// the data disk, and the host saves that state (qemu's migration into a
// file, VM.Save): every boot after restores it, plugs the data disk in
// (VM.AttachDisk over QMP, PCIe hot-plug) and lets init go on: the clock
// from the emulated RTC, the mount, the daemon and the agent. The guest
// never saw the data disk before the restore, so nothing of it is in its
// page cache; a cut is still qemu killed and a machine started afresh on
// what the disk's medium kept. (The restored kernel starts each boot from
// the same random state; the daemon's draws may repeat from one boot to
// the next, which a check of files does not mind.) The daemon
// reaches a real S3 server (versitygw) on the host's loopback through
// qemu's user networking. A first model is warmed up without a cut; the
// number of writes and flushes that took places the cuts. Then, for each
// cut, a new model is added (the add acknowledged, so it must survive)
// and the power goes at a seeded point: uniformly within the warm-up, or,
// for every second cut, within the publish: it starts with fsyncs of files
// the part records made durable already, a burst of flushes with nothing to
// write (Disk.CutAfterFlushBurst), and goes on with the renames, the
// directory's fsync and the state's records, where the cut falls. The machine boots again on the surviving image, and at once,
// before the daemon resumes anything:
//
//   - the daemon starts (its bbolt state opens) and its API answers;
//   - every model added before the cut is still known (none lost);
//   - every model it reports ready holds exactly its source's files, by
//     size and SHA-256, both at the path the daemon reports and through
//     the model's current link. The guest agent (guestagent) hashes them
//     in the guest, through the guest's kernel, as a serving framework
//     would read them.
//
// Then the cut model must resume to ready and pass the same check, and the
// next cut is made in the same machine, so later cuts also check that
// earlier, ready models stay intact.
//
// # Power cuts in image pulls
//
// With PowerCutOptions.ImageCuts (TestPowerCutsImages; bench chaos
// --vm-image-cuts) the guest also runs containerd: Debian's binary on the
// tools disk, the shared libraries ldd lists for it (SharedLibs) in the
// initramfs, the overlay module for its snapshotter, its root and state
// on the data disk (so its metadata DB, content store and snapshots are
// what a cut hits), its socket in /run. The daemon runs with containerd
// on and pre-pulls images that the test pushes (testimage: layers of
// seeded random bytes) to a docker-registry on the host's loopback,
// reached over qemu's user networking as plain HTTP (a hosts.toml). No
// container runs, so runc is not shipped. After one model's warm-up and
// one image's pull without a cut, each cut claims a new image and the
// power goes at a seeded point of its pull: uniformly within it, or, for
// every second cut, within its end (the last blobs' commits, the unpack,
// the image's record and the daemon's label). After the reboot, before
// anything resumes, both audits run: every model and image claim
// acknowledged is still known, every ready model is whole, and every
// image the daemon reports ready is complete in containerd: the agent
// reads every blob of it (index or manifest, config, layers) through the
// guest's containerd and hashes it against its digest, and asks whether
// it is unpacked. Then the cut image must be pulled to ready and pass the
// same check. Such cuts found that containerd keeps a blob's record when
// the cut takes its file (it does not make the blob's rename durable), so
// that every later pull failed; the image cache now fetches such blobs
// again (see package containerd).
//
// # Running it
//
// The suite needs qemu-system-x86_64, Debian's cloud kernel
// (linux-image-cloud-amd64), busybox-static, mkfs.ext4 and versitygw
// (and containerd and docker-registry for the image cuts);
// `make test` installs them as root. Without one it skips, except in CI
// (CI=true), where it fails; bench chaos says why it made no cut
// (power_cuts_skipped) instead of printing a figure. It needs no KVM
// (software emulation, two virtual CPUs) and no root (TestBenchChaosPowerCuts
// does: its chaos scenario runs in network namespaces).
// WARMFLEET_VM_CUTS sets the number of cuts (default DefaultCuts, 2: one
// in a warm-up, one in its publish; `make test` runs 20, `make test
// VM_CUTS=N` N),
// WARMFLEET_VM_IMAGE_CUTS the number of cuts in image pulls
// (TestPowerCutsImages, which also needs containerd and docker-registry;
// default DefaultImageCuts, 2, which `make test` runs too, `make test
// VM_IMAGE_CUTS=N` N, 0 skips it), WARMFLEET_VM_SEED the seed (default 1;
// bench chaos --vm-seed):
//
//	WARMFLEET_VM_CUTS=20 WARMFLEET_VM_SEED=7 go test -run 'TestPowerCuts$' -v -timeout 60m ./integration/vm
//	WARMFLEET_VM_IMAGE_CUTS=10 go test -run TestPowerCutsImages -v -timeout 60m ./integration/vm
//
// Every cut costs a boot of the emulated machine (a cut leaves a guest
// kernel whose page cache no longer matches its disk, so no two cuts can
// share one boot), the daemon's start, the audit, the resume and a
// warm-up to the next cut point. A boot is a restore of the saved state
// (most of it the two binaries, read into the page cache before the save
// so that no boot reads them through the emulated disk again), the hot-plug
// and two Go programs' start (three, and containerd's start, with
// images); the firmware and the kernel's start are paid once, in the
// setup. The summary line splits the time into setup, the
// first warm-up, boots, recoveries and warm-ups.
//
// The test logs each cut (where it fell, the crash mode, what the disk
// lost, whether the model was ready after the reboot) and a summary: cuts,
// ready at reboot, resumed, corrupt ready, entries lost, median boot time,
// where the time went; a failure names the seed and count that replay it.
package vm
