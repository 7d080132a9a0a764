package s3origin

import "github.com/warmfleet/warmfleet/origin"

// The data types the daemon and the origins share are package origin's;
// these names keep s3origin's callers and hforigin reading as before.
type (
	Object       = origin.Object
	File         = origin.File
	Plan         = origin.Plan
	Verification = origin.Verification
	RangeCRC     = origin.RangeCRC
)
