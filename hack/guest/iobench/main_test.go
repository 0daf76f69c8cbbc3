package main

import "testing"

func TestParse(t *testing.T) {
	p, err := parse("disk:dev-xvda,32,500,3")
	if err != nil || p != (params{target: "disk:dev-xvda", mib: 32, ops: 500, runs: 3}) {
		t.Errorf("parse: %+v, %v", p, err)
	}
	if p, err := parse("dir:/shared,8,1,1"); err != nil || p.target != "dir:/shared" {
		t.Errorf("parse dir: %+v, %v", p, err)
	}
	for _, bad := range []string{"", "disk:a,1,1", "file:/x,1,1,1", "disk:a,0,1,1", "disk:a,1,x,1", "disk:a,1,1,-2"} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}
