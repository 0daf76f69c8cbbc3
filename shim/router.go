package shim

import (
	"context"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	ptypes "github.com/containerd/containerd/protobuf/types"
)

// plainRouter is the task API the shim serves: a call for a task runc
// runs (plain.go) goes to the embedded runc task service, every other
// to the VM service. Create decides the route (service.Create), Delete
// also drops the shim's records, Shutdown stays the VM service's (the
// runc service's own would end the shim under the VMs).
type plainRouter struct{ s *service }

var _ taskAPI.TaskService = plainRouter{}

func (p plainRouter) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	return p.s.Create(ctx, r)
}

func (p plainRouter) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.State(ctx, r)
	}
	return p.s.State(ctx, r)
}

func (p plainRouter) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Start(ctx, r)
	}
	return p.s.Start(ctx, r)
}

func (p plainRouter) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	if rs, pt := p.s.plainFor(r.ID); rs != nil {
		return p.s.deletePlain(ctx, rs, pt, r)
	}
	return p.s.Delete(ctx, r)
}

func (p plainRouter) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Pids(ctx, r)
	}
	return p.s.Pids(ctx, r)
}

func (p plainRouter) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Pause(ctx, r)
	}
	return p.s.Pause(ctx, r)
}

func (p plainRouter) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Resume(ctx, r)
	}
	return p.s.Resume(ctx, r)
}

func (p plainRouter) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Checkpoint(ctx, r)
	}
	return p.s.Checkpoint(ctx, r)
}

func (p plainRouter) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Kill(ctx, r)
	}
	return p.s.Kill(ctx, r)
}

func (p plainRouter) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Exec(ctx, r)
	}
	return p.s.Exec(ctx, r)
}

func (p plainRouter) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.ResizePty(ctx, r)
	}
	return p.s.ResizePty(ctx, r)
}

func (p plainRouter) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.CloseIO(ctx, r)
	}
	return p.s.CloseIO(ctx, r)
}

func (p plainRouter) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Update(ctx, r)
	}
	return p.s.Update(ctx, r)
}

func (p plainRouter) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Wait(ctx, r)
	}
	return p.s.Wait(ctx, r)
}

func (p plainRouter) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Stats(ctx, r)
	}
	return p.s.Stats(ctx, r)
}

func (p plainRouter) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	if rs, _ := p.s.plainFor(r.ID); rs != nil {
		return rs.Connect(ctx, r)
	}
	return p.s.Connect(ctx, r)
}

func (p plainRouter) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	return p.s.Shutdown(ctx, r)
}
