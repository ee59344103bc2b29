// Command fakecri serves the in-memory CRI runtime and image services of k8s.io/cri-client/pkg/fake on a
// unix socket, so that a real kubelet can run pods without a container runtime. Each CreateContainer
// request's envs, mounts, devices, CDI devices and annotations (what the kubelet's device manager got from
// the device plugin's Allocate) are printed to stdout as one JSON line, since the fake keeps none of them.
// It runs until killed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// recorder is the fake runtime with CreateContainer wrapped to print the container config.
type recorder struct {
	*fake.RemoteRuntime
}

func (r recorder) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	config := req.GetConfig()
	line, _ := json.Marshal(map[string]any{
		"event":       "CreateContainer",
		"pod":         req.GetSandboxConfig().GetMetadata(),
		"container":   config.GetMetadata().GetName(),
		"envs":        config.GetEnvs(),
		"mounts":      config.GetMounts(),
		"devices":     config.GetDevices(),
		"cdi_devices": config.GetCDIDevices(),
		"annotations": config.GetAnnotations(),
	})
	os.Stdout.Write(append(line, '\n'))
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

func main() {
	endpoint := flag.String("listen", "", "CRI endpoint to serve, e.g. unix:///tmp/n1/cri.sock")
	mountpoint := flag.String("image-fs", "/", "mount point reported as the image and container filesystem")
	flag.Parse()
	path, ok := strings.CutPrefix(*endpoint, "unix://")
	if !ok {
		log.Fatal("fakecri: --listen must be unix:///path")
	}

	runtime := recorder{fake.NewFakeRemoteRuntime()}
	// Without filesystem usage ImageFsInfo answers empty lists and the kubelet's stats provider complains.
	usage := []*kubeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &kubeapi.FilesystemIdentifier{Mountpoint: *mountpoint},
		UsedBytes:  &kubeapi.UInt64Value{Value: 0},
		InodesUsed: &kubeapi.UInt64Value{Value: 0},
	}}
	runtime.ImageService.SetFakeFilesystemUsage(usage)
	runtime.ImageService.SetFakeContainerFilesystemUsage(usage)
	// A pulled image of size 0 fails the kubelet's image inspection ("Id or size of image ... is not set").
	runtime.ImageService.SetFakeImageSize(1 << 20)
	// What fake.RemoteRuntime.Start sets: the runtime and its network are ready (the kubelet needs no CNI).
	runtime.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}

	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		log.Fatalf("fakecri: %v", err)
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, runtime)
	kubeapi.RegisterImageServiceServer(server, runtime)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Fatalf("fakecri: %v", err)
		}
	}()
	log.Printf("fakecri: serving %s", *endpoint)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	server.Stop()
}
