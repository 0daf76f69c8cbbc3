package testenv

import "testing"

func TestClientPid(t *testing.T) {
	info := "id             : 4\nconnection_time: 2026-11-26 04:24:33+0000\ntransport      : unix\nreadonly       : no\nunix_user_id   : " +
		"0\nunix_process_id: 5380\n"
	if pid, ok := clientPid(info); !ok || pid != 5380 {
		t.Errorf("clientPid = %d, %v; want 5380, true", pid, ok)
	}
	if _, ok := clientPid("id : 5\ntransport : tcp\n"); ok {
		t.Error("clientPid found a pid in a client without one")
	}
}
