package testenv

import (
	"context"
	"fmt"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Tasks reads task state over containerd's own gRPC API (the tasks
// service), without the cost of running ctr for every look.
type Tasks struct {
	conn   *grpc.ClientConn
	client tasks.TasksClient
}

// DialTasks connects to the daemon's tasks service.
func (c *Containerd) DialTasks() (*Tasks, error) {
	conn, err := grpc.Dial("unix://"+c.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial containerd at %s: %w", c.Address, err)
	}
	return &Tasks{conn: conn, client: tasks.NewTasksClient(conn)}, nil
}

// Close closes the connection.
func (t *Tasks) Close() error { return t.conn.Close() }

// Status returns the task's status as ctr task ls prints it ("RUNNING",
// "STOPPED", ...) and its pid; status is "" when there is no such task.
func (t *Tasks) Status(ctx context.Context, ns, id string) (string, uint32, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ns)
	resp, err := t.client.Get(ctx, &tasks.GetRequest{ContainerID: id})
	if status.Code(err) == codes.NotFound {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("get task %s/%s: %w", ns, id, err)
	}
	return resp.GetProcess().GetStatus().String(), resp.GetProcess().GetPid(), nil
}
