package sandbox_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/cri"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The simulated node validates a config as machined does (metal, installed) and answers
// InvalidArgument with Talos's own message; a config without v1alpha1 is refused the same way.
// Negative control: its current config applies (staged).
func TestFidelityValidation(t *testing.T) {
	ctx := context.Background()
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	nctx := onNode(ctx, t, "prod-worker-2")

	cur := activeConfig(ctx, t, talos, nctx)
	data, _ := cur.Provider().Bytes()
	writesBefore := stats(t).TalosWrites["prod-worker-2"]

	blank := []byte(strings.Replace(string(data), "endpoint: "+controlPlaneEndpoint(t, cur), `endpoint: ""`, 1))
	for _, tc := range []struct {
		name, want string
		data       []byte
	}{
		{"blank_endpoint", "invalid controlplane endpoint: hostname must not be blank", blank},
		{"not_yaml", "", []byte("{{{")},
		{"no_v1alpha1", "doesn't contain v1alpha1 config", []byte("apiVersion: v1alpha1\nkind: RegistryAuthConfig\nname: ghcr.io\nusername: u\npassword: p\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: tc.data, Mode: machine.ApplyConfigurationRequest_STAGED})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want InvalidArgument %q, got %v", tc.want, err)
			}
		})
	}

	if got := stats(t).TalosWrites["prod-worker-2"]; got != writesBefore {
		t.Fatalf("a refused config counted %d writes", got-writesBefore)
	}

	if _, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_STAGED}); err != nil {
		t.Fatalf("the node's own config: %v", err)
	}
}

// A dry run answers with Talos's summary and config diff and changes nothing; AUTO picks
// no-reboot for a registry-auth change on Talos 1.13 (machined compares only v1alpha1) — the
// answer that leaves the runtime on the old credential, which is why ghcrsync stages instead.
func TestFidelityDryRunDiff(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	nctx := onNode(ctx, t, "prod-worker-2")

	cur := activeConfig(ctx, t, talos, nctx)
	next := withRegistryAuth(t, cur.Provider(), sandbox.Credential{Username: "dry-run-user", Password: "dry-run-secret"})

	resp, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: next, Mode: machine.ApplyConfigurationRequest_AUTO, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}

	details := resp.GetMessages()[0].GetModeDetails()
	for _, want := range []string{"Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n", "+username: dry-run-user", "-username: " + sb.OldCredential().Username} {
		if !strings.Contains(details, want) {
			t.Fatalf("dry run details lack %q:\n%s", want, details)
		}
	}

	if got := resp.GetMessages()[0].GetMode(); got != machine.ApplyConfigurationRequest_NO_REBOOT {
		t.Fatalf("AUTO for a registry-auth change on 1.13: mode %s", got)
	}

	if !activeConfig(ctx, t, talos, nctx).Metadata().Version().Equal(cur.Metadata().Version()) {
		t.Fatal("a dry run changed the config")
	}

	same, _ := cur.Provider().Bytes()

	resp, err = talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: same, Mode: machine.ApplyConfigurationRequest_AUTO, DryRun: true})
	if err != nil || !strings.HasSuffix(resp.GetMessages()[0].GetModeDetails(), "Config diff:\n\nNo changes.") {
		t.Fatalf("dry run of the same config: %v %q", err, resp.GetMessages()[0].GetModeDetails())
	}
}

// Try mode applies a change that needs no reboot to the active config only, and rolls it back
// after its timeout; a change that would need a reboot is refused in try mode.
func TestFidelityTryModeRollsBack(t *testing.T) {
	ctx := context.Background()
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	nctx := onNode(ctx, t, "prod-worker-2")

	cur := activeConfig(ctx, t, talos, nctx)
	data, _ := cur.Provider().Bytes()
	labelled := []byte(strings.Replace(string(data), "machine:\n", "machine:\n  nodeLabels:\n    sandbox.ghcrsync.dev/try: \"yes\"\n", 1))

	resp, err := talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{
		Data: labelled, Mode: machine.ApplyConfigurationRequest_TRY, TryModeTimeout: durationpb.New(time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}

	if d := resp.GetMessages()[0].GetModeDetails(); !strings.Contains(d, "will be automatically reverted back in 1s") {
		t.Fatalf("try mode details: %q", d)
	}

	if activeConfig(ctx, t, talos, nctx).Config().Machine().NodeLabels()["sandbox.ghcrsync.dev/try"] != "yes" {
		t.Fatal("try mode did not apply the change")
	}

	sandboxtest.Eventually(t, 10*time.Second, "try mode rolls back", func() error {
		if activeConfig(ctx, t, talos, nctx).Config().Machine().NodeLabels()["sandbox.ghcrsync.dev/try"] != "" {
			return errors.New("still applied")
		}

		return nil
	})

	// A v1alpha1 change that needs a reboot is refused in try mode.
	token := cur.Config().Machine().Security().Token()
	retokened := []byte(strings.Replace(string(data), "token: "+token, "token: "+map[bool]string{true: "y", false: "z"}[token[0] == 'z']+token[1:], 1))

	_, err = talos.ApplyConfiguration(nctx, &machine.ApplyConfigurationRequest{Data: retokened, Mode: machine.ApplyConfigurationRequest_TRY})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "can't be applied in immediate mode") {
		t.Fatalf("a reboot-requiring change in try mode: %v", err)
	}
}

// Talos serves its resource definitions (names, aliases, sensitivity) and namespaces, and the
// resources an operator reads: machine config, machine type and status, members, nodename,
// version, registry config. The registry config is sensitive: os:reader is refused it, as the
// machine config; writes through the API are refused.
func TestFidelityResources(t *testing.T) {
	ctx := context.Background()
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	reader := sandboxtest.Talos(t, sandbox.TalosconfigReaderFile)
	nctx := onNode(ctx, t, "prod-worker-1")

	mcRD, err := safe.StateGetByID[*meta.ResourceDefinition](nctx, talos.COSI, "machineconfigs.config.talos.dev")
	if err != nil {
		t.Fatal(err)
	}

	if spec := mcRD.TypedSpec(); !slices.Contains(spec.AllAliases, "mc") || spec.Sensitivity != meta.Sensitive {
		t.Fatalf("machine config definition: %+v", spec)
	}

	for _, typ := range []resource.Type{cluster.MemberType, k8s.NodenameType, runtime.VersionType, runtime.MachineStatusType, cri.RegistriesConfigType, meta.ResourceDefinitionType} {
		if _, err := safe.StateGetByID[*meta.ResourceDefinition](nctx, reader.COSI, strings.ToLower(typ)); err != nil {
			t.Errorf("definition of %s: %v", typ, err)
		}
	}

	nodename, err := safe.StateGetByID[*k8s.Nodename](nctx, reader.COSI, k8s.NodenameID)
	if err != nil || nodename.TypedSpec().Nodename != "prod-worker-1" {
		t.Fatalf("nodename: %v %+v", err, nodename)
	}

	members, err := safe.StateListAll[*cluster.Member](nctx, reader.COSI)
	if err != nil || members.Len() != len(sandboxtest.Get(t).Fleet().Machines()) {
		t.Fatalf("members: %v %d", err, members.Len())
	}

	ms, err := safe.StateGetByID[*runtime.MachineStatus](nctx, reader.COSI, runtime.MachineStatusID)
	if err != nil || ms.TypedSpec().Stage != runtime.MachineStageRunning || !ms.TypedSpec().Status.Ready {
		t.Fatalf("machine status: %v %+v", err, ms)
	}

	rc, err := safe.StateGetByID[*cri.RegistriesConfig](nctx, talos.COSI, cri.RegistriesConfigID)
	if err != nil || rc.TypedSpec().RegistryAuths[sandbox.RegistryHost] == nil {
		t.Fatalf("registry config: %v", err)
	}

	for _, read := range []func() error{
		func() error {
			_, err := safe.StateGetByID[*cri.RegistriesConfig](nctx, reader.COSI, cri.RegistriesConfigID)
			return err
		},
		func() error { return talos.COSI.Create(nctx, k8s.NewNodename(k8s.NamespaceName, "forged")) },
	} {
		if err := read(); client.StatusCode(err) != codes.PermissionDenied && !strings.Contains(fmtErr(err), "code = PermissionDenied") {
			t.Errorf("want PermissionDenied, got %v", err)
		}
	}

	mt, err := safe.StateGetByID[*talosconfig.MachineType](nctx, reader.COSI, talosconfig.MachineTypeID)
	if err != nil || mt.MachineType().String() != "worker" {
		t.Fatalf("machine type: %v", err)
	}
}

// Replies carry apid's metadata: none one-to-one; in one-to-many replies, the node address the
// client asked for (not the machine's name), and a failed node's error with its status. Version
// says RBAC is on; etcd APIs on a worker are Unimplemented.
func TestFidelityReplyMetadataAndCodes(t *testing.T) {
	ctx := context.Background()
	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	worker, cp := machineIP(t, "prod-worker-1"), machineIP(t, "prod-control-plane-2")

	one, err := talos.Version(client.WithNode(ctx, worker))
	if err != nil || one.GetMessages()[0].GetMetadata() != nil || !one.GetMessages()[0].GetFeatures().GetRbac() {
		t.Fatalf("one-to-one version: %v %+v", err, one)
	}

	many, err := talos.MachineClient.Version(client.WithNodes(ctx, worker, cp, "127.0.0.254"), nil)
	if err != nil {
		t.Fatal(err)
	}

	var hosts []string

	for _, m := range many.GetMessages() {
		hosts = append(hosts, m.GetMetadata().GetHostname())
	}

	if !slices.Equal(hosts, []string{worker, cp, "127.0.0.254"}) || many.GetMessages()[2].GetMetadata().GetStatus().GetCode() != int32(codes.Unavailable) {
		t.Fatalf("one-to-many metadata: %v %+v", hosts, many.GetMessages()[2].GetMetadata())
	}

	if _, err := talos.EtcdMemberList(client.WithNode(ctx, worker), &machine.EtcdMemberListRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("etcd members on a worker: %v", err)
	}
}

// Read serves the boot ID; Events start with a hello, replay the boot (sequence, services, the
// machine's RUNNING/ready status) and end with Unavailable when the machine goes down; Memory,
// Dmesg, Logs and Kubeconfig answer.
func TestFidelityMachineServiceStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	talos := sandboxtest.Talos(t, sandbox.TalosconfigFile)
	nctx := onNode(ctx, t, "prod-control-plane-2")

	r, err := talos.Read(nctx, "/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}

	boot, _ := io.ReadAll(r)
	if m, _ := sandboxtest.Get(t).Fleet().Machine("prod-control-plane-2"); strings.TrimSpace(string(boot)) != m.BootID() {
		t.Fatalf("boot id %q", boot)
	}

	absent, err := talos.Read(nctx, "/etc/shadow")
	if err == nil {
		_, err = io.ReadAll(absent)
	}

	if client.StatusCode(err) != codes.NotFound && !strings.Contains(fmtErr(err), "no such file or directory") {
		t.Fatalf("read of an absent file: %v", err)
	}

	events := make(chan client.EventResult, 64)
	if err := talos.EventsWatchV2(nctx, events, client.WithTailEvents(-1)); err != nil {
		t.Fatal(err)
	}

	sawReady := false

	for !sawReady {
		select {
		case ev := <-events:
			if st, ok := ev.Event.Payload.(*machine.MachineStatusEvent); ok && st.GetStage() == machine.MachineStatusEvent_RUNNING && st.GetStatus().GetReady() {
				sawReady = true
			}
		case <-ctx.Done():
			t.Fatal("no RUNNING/ready machine status event")
		}
	}

	mem, err := talos.Memory(nctx)
	if err != nil || mem.GetMessages()[0].GetMeminfo().GetMemtotal() < 2<<20 {
		t.Fatalf("memory: %v", err)
	}

	kc, err := talos.Kubeconfig(nctx)
	if err != nil || !strings.Contains(string(kc), "server: ") {
		t.Fatalf("kubeconfig: %v", err)
	}

	logs, err := talos.Logs(nctx, "system", 0, "etcd", false, -1)
	if err != nil {
		t.Fatal(err)
	}

	lr, _ := client.ReadStream(logs)
	if b, _ := io.ReadAll(lr); !strings.Contains(string(b), `service "etcd" started`) {
		t.Fatalf("etcd log: %q", b)
	}
}

func activeConfig(ctx context.Context, t *testing.T, talos *client.Client, nctx context.Context) *talosconfig.MachineConfig {
	t.Helper()

	mc, err := safe.StateGetByID[*talosconfig.MachineConfig](nctx, talos.COSI, talosconfig.ActiveID)
	if err != nil {
		t.Fatal(err)
	}

	return mc
}

func controlPlaneEndpoint(t *testing.T, mc *talosconfig.MachineConfig) string {
	t.Helper()

	p, err := configloader.NewFromBytes(must(mc.Provider().Bytes()))
	if err != nil {
		t.Fatal(err)
	}

	return p.Cluster().Endpoint().String()
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}

	return b
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}

	return err.Error()
}

var _ = metav1.GetOptions{}
