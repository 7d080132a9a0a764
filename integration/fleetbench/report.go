package fleetbench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/warmfleet/warmfleet/integration/netlab"
)

// WriteJSON writes the result as indented JSON.
func (r Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the result for people: a fleet line per mode, then the
// hosts of each mode's median run.
func (r Result) WriteTable(w io.Writer) error {
	procs := "all cores"
	if r.HostProcs > 0 {
		procs = fmt.Sprintf("GOMAXPROCS %d", r.HostProcs)
	}
	origin := "S3"
	if r.S3KeepAlive {
		origin = "S3 behind a keep-alive front"
	}
	if r.Origin == originHub {
		origin = "origin: a Hub on the S3 host; S3 figures are the Hub's"
	}
	fmt.Fprintf(w, "fleet: %d hosts (daemons at %s), link %s (S3 link %s, %s), model %s in %d files, %d run(s) per mode (median shown), %.0f s pause before each\n\n",
		r.Hosts, procs, r.Link, r.S3Link, origin, netlab.Size(r.ModelBytes), r.Files, r.Runs, r.SettleSeconds)
	if pc := r.PageCache; pc != nil {
		fmt.Fprintf(w, "page cache: writing %s into memory freed %.0f s before cost %.2f CPU-s per GiB, %.2f into memory just freed (%s); each run writes the model once per host, a pause after the last run's data was deleted\n\n",
			netlab.Size(pc.Bytes), r.SettleSeconds, pc.AfterPauseCPUSecondsPerGiB, pc.AtOnceCPUSecondsPerGiB, reportingText(pc.FreePageReporting))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tWARM_S\tLOWER_BOUND_S\tWARM_RATIO\tS3_EGRESS_RATIO\tPEAK_RSS\tRUNS_S")
	for _, m := range r.Modes {
		if !m.Available {
			fmt.Fprintf(tw, "%s\tn/a\t%.1f\tn/a\tn/a\tn/a\tnot available: %s\n", m.Mode, m.LowerBoundSeconds, m.Reason)
			continue
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%.2f\t%s\t%s\n", m.Mode, m.WarmSeconds, m.LowerBoundSeconds,
			m.WarmRatio, m.S3EgressRatio, mib(m.PeakRSSBytes), seconds(m.RunSeconds))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range r.Modes {
		if u := m.S3Link; u != nil && u.BusySeconds > 0 {
			fmt.Fprintf(w, "%s: the S3 link counted %s sent (%.3fx the model), %.1f MB/s until %.1f s; the last host was ready %.1f s later\n",
				m.Mode, netlab.Size(u.SentBytes).Human(), float64(u.SentBytes)/float64(r.ModelBytes), float64(u.SentBytes)/u.BusySeconds/1e6, u.BusySeconds, m.WarmSeconds-u.BusySeconds)
		}
		if l := m.Losses; l != nil {
			fmt.Fprintf(w, "%s: the S3 host retransmitted %d of %d TCP segments (%.1f%%); link shapers dropped %d packets into the hosts, %d out of them, %d out of S3\n",
				m.Mode, l.S3Retransmitted, l.S3Segments+l.S3Retransmitted, 100*l.RetransmitShare(), l.DownlinkDrops, l.UplinkDrops, l.S3UplinkDrops)
		}
	}
	if so := r.ScaleOut; so != nil {
		fmt.Fprintf(w, "\nscale-out: 1 host joining %d warm ones: %.1f s, lower bound %.1f s, ratio %.2f, %d bytes from S3, %d from peers\n",
			r.Hosts-1, so.Seconds, so.LowerBoundSeconds, so.Ratio, so.S3Bytes, so.PeerBytes)
	}
	if r.SwarmSpeedup != nil {
		fmt.Fprintf(w, "\nswarm is %.2fx faster than naive\n", *r.SwarmSpeedup)
	}
	for _, m := range r.Modes {
		if !m.Available {
			continue
		}
		fmt.Fprintf(w, "\n%s, median run:\n", m.Mode)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HOST\tREADY_S\tFROM_S3\tFROM_PEERS\tPEAK_RSS\tCPU_S\tDIALS\tNOT_OPEN")
		for _, h := range m.Hosts {
			peers := "n/a"
			if h.PeerBytes != nil {
				peers = netlab.Size(*h.PeerBytes).Human()
			}
			fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t%s\t%.1f\t%s\t%s\n", h.Host, h.ReadySeconds, netlab.Size(h.S3Bytes).Human(), peers, mib(h.PeakRSSBytes), h.CPUSeconds, count(h.Dials), count(h.NotOpen))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// count shows a counter a daemon may not export.
func count(v *int64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprint(*v)
}

func mib(b int64) string { return fmt.Sprintf("%.0fMiB", float64(b)/(1<<20)) }

func seconds(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.1f", x)
	}
	return strings.Join(s, " ")
}

// reportingText says whether the VM hands freed memory back to its host.
func reportingText(on *bool) string {
	switch {
	case on == nil:
		return "no virtio balloon"
	case *on:
		return "this VM reports free memory to its host, which takes it back: writes fault it in again"
	}
	return "virtio balloon without free page reporting"
}
