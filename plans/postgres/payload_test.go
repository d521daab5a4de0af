package postgres

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/plans"
)

func TestParsePayload(t *testing.T) {
	tests := []struct {
		payload string
		want    plans.Change
		wantErr string
	}{
		{payload: "plan:pro:7", want: plans.Change{Kind: plans.PlanChanged, ID: "pro", Version: 7}},
		{payload: "subject:c1:12", want: plans.Change{Kind: plans.AssignmentChanged, ID: "c1", Version: 12}},
		{payload: "subject:tenant:42:key:3", want: plans.Change{Kind: plans.AssignmentChanged, ID: "tenant:42:key", Version: 3}},
		{payload: "subject:::3", want: plans.Change{Kind: plans.AssignmentChanged, ID: ":", Version: 3}},
		{payload: "plan:x:9007199254740991", want: plans.Change{Kind: plans.PlanChanged, ID: "x", Version: plans.MaxVersion}},
		{payload: "", wantErr: "want <kind>:<id>:<version>"},
		{payload: "plan", wantErr: "want <kind>:<id>:<version>"},
		{payload: "plan:pro", wantErr: "want <kind>:<id>:<version>"},
		{payload: "tier:pro:7", wantErr: `kind "tier" is neither "plan" nor "subject"`},
		{payload: "plan::7", wantErr: "empty id"},
		{payload: "plan:pro:", wantErr: `version ""`},
		{payload: "plan:pro:0", wantErr: `version "0"`},
		{payload: "plan:pro:-1", wantErr: `version "-1"`},
		{payload: "plan:pro:seven", wantErr: `version "seven"`},
		{payload: "plan:pro:9007199254740992", wantErr: `version "9007199254740992"`},
		{payload: "plan:pro:18446744073709551616", wantErr: "is not an integer from 1 to 2^53-1"},
	}
	for _, tt := range tests {
		got, err := parsePayload(tt.payload)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.payload)) {
				t.Errorf("parsePayload(%q) = %+v, %v; want an error quoting the payload and containing %q", tt.payload, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parsePayload(%q) = %+v, %v; want %+v", tt.payload, got, err, tt.want)
		}
	}
}

// FuzzParsePayload: any payload is a change or an error, never a panic,
// and a change written back as the triggers write it reads the same.
func FuzzParsePayload(f *testing.F) {
	for _, seed := range []string{"plan:pro:7", "subject:a:b:c:1", "subject:::3", "plan:x:", ":::", "plan:x:0009"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		c, err := parsePayload(payload)
		if err != nil {
			return
		}
		kind := map[plans.ChangeKind]string{plans.PlanChanged: planKind, plans.AssignmentChanged: subjectKind}[c.Kind]
		again, err := parsePayload(fmt.Sprintf("%s:%s:%d", kind, c.ID, c.Version))
		if err != nil || again != c {
			t.Fatalf("parsePayload(%q) = %+v, but its formatted form reads %+v, %v", payload, c, again, err)
		}
	})
}
