// karmada-client calls gpu-extender's scheduler-estimator service with Karmada's own code, for
// the end-to-end tests (tests/e2e/karmada.rs):
//
//	karmada-client estimate --addr HOST:PORT --cluster NAME --template T.json [--summary S.json]
//	    T.json is a work/v1alpha2 ReplicaRequirements (what karmada-scheduler estimates for),
//	    S.json a cluster/v1alpha1 ResourceSummary (what karmada-controller-manager reports of
//	    the member). The estimate goes through Karmada's SchedulerEstimator (the accurate
//	    estimator client karmada-scheduler runs with --enable-scheduler-estimator), dialled with
//	    Karmada's grpcconnection; with --summary, Karmada's GeneralEstimator (the default,
//	    summing allocatable resources) answers the same template too. Prints one JSON line:
//	    {"accurate": N, "general": M} (general -1 without --summary), or exits non-zero with the
//	    error, gRPC status included.
//
//	    With --ca-file (karmada-scheduler's --scheduler-estimator-ca-file) the call goes over
//	    TLS, verifying the estimator's certificate; --cert-file and --key-file
//	    (--scheduler-estimator-cert-file, --scheduler-estimator-key-file) present a client
//	    certificate. Every subcommand that dials takes them, and --dial-timeout (default 5s).
//
//	karmada-client unschedulable --addr HOST:PORT --cluster NAME --namespace NS --name NAME
//	    [--kind Deployment] [--api-version apps/v1] [--threshold DURATION]
//	    Asks how many of the workload's replicas have been unschedulable longer than the
//	    threshold, through Karmada's SchedulerEstimator.GetUnschedulableReplicas (what
//	    karmada-descheduler asks), dialled as for estimate. Prints {"unschedulable": N}, or
//	    exits non-zero with the error, gRPC status included.
//
//	karmada-client check-protos DIR
//	    Checks that DIR (gpu-extender's proto/) holds this Karmada version's estimator protos
//	    byte for byte and, for the trimmed Kubernetes files, that every message block kept
//	    equals the block of the k8s.io module versions this module resolves.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	clusterv1alpha1 "github.com/karmada-io/karmada/pkg/apis/cluster/v1alpha1"
	workv1alpha2 "github.com/karmada-io/karmada/pkg/apis/work/v1alpha2"
	estimatorclient "github.com/karmada-io/karmada/pkg/estimator/client"
	estimatorservice "github.com/karmada-io/karmada/pkg/estimator/service"
	"github.com/karmada-io/karmada/pkg/util/grpcconnection"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: karmada-client estimate|unschedulable|check-protos ...")
	}
	var err error
	switch os.Args[1] {
	case "estimate":
		err = estimate(os.Args[2:])
	case "unschedulable":
		err = unschedulable(os.Args[2:])
	case "check-protos":
		if len(os.Args) != 3 {
			fail("usage: karmada-client check-protos DIR")
		}
		err = checkProtos(os.Args[2])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err.Error())
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, "karmada-client:", message)
	os.Exit(1)
}

func readJSON(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

func estimate(args []string) error {
	flags := flag.NewFlagSet("estimate", flag.ContinueOnError)
	addr := flags.String("addr", "", "the estimator's host:port")
	cluster := flags.String("cluster", "member", "the member cluster's name")
	templatePath := flags.String("template", "", "ReplicaRequirements JSON")
	summaryPath := flags.String("summary", "", "ResourceSummary JSON (optional)")
	tls := addTLSFlags(flags)
	if err := flags.Parse(args); err != nil {
		return err
	}
	var requirements workv1alpha2.ReplicaRequirements
	if err := readJSON(*templatePath, &requirements); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	member := &clusterv1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: *cluster}}
	general := int32(-1)
	if *summaryPath != "" {
		var summary clusterv1alpha1.ResourceSummary
		if err := readJSON(*summaryPath, &summary); err != nil {
			return fmt.Errorf("summary: %w", err)
		}
		member.Status.ResourceSummary = &summary
		answer, err := estimatorclient.NewGeneralEstimator().MaxAvailableReplicas(context.Background(),
			estimatorclient.ReplicaEstimationRequest{
				Clusters:            []*clusterv1alpha1.Cluster{member},
				ReplicaRequirements: &requirements,
			})
		if err != nil {
			return fmt.Errorf("general estimator: %w", err)
		}
		general = answer[0].Replicas
	}

	accurate, closeConn, err := connect(*addr, *cluster, tls)
	if err != nil {
		return err
	}
	defer closeConn()
	answer, err := accurate.MaxAvailableReplicas(context.Background(), estimatorclient.ReplicaEstimationRequest{
		Clusters:            []*clusterv1alpha1.Cluster{member},
		ReplicaRequirements: &requirements,
	})
	if err != nil {
		return fmt.Errorf("scheduler estimator: %w", err)
	}
	// Karmada's client turns a failed call into UnauthenticReplica (-1) for that cluster and
	// logs the error; the test wants the answer, so that is an error here.
	if answer[0].Replicas < 0 {
		return fmt.Errorf("scheduler estimator: no answer for cluster %s (replicas %d)", *cluster, answer[0].Replicas)
	}
	out, err := json.Marshal(map[string]int32{"accurate": answer[0].Replicas, "general": general})
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// tlsFlags are karmada-scheduler's TLS settings for its estimator connections.
// With them, how long the dial may take (a refused handshake fails only when it runs out).
type tlsFlags struct {
	ca, cert, key *string
	dialTimeout   *time.Duration
}

func addTLSFlags(flags *flag.FlagSet) tlsFlags {
	return tlsFlags{
		ca:          flags.String("ca-file", "", "CA verifying the estimator's certificate (TLS when set)"),
		cert:        flags.String("cert-file", "", "client certificate presented to the estimator"),
		key:         flags.String("key-file", "", "the client certificate's key"),
		dialTimeout: flags.Duration("dial-timeout", 5*time.Second, "how long dialling may take"),
	}
}

// connect dials the estimator as karmada-scheduler does (estimatorclient.EstablishConnection,
// minus the Service lookup): Karmada's dialer, its cache, its client.
func connect(addr, cluster string, tls tlsFlags) (*estimatorclient.SchedulerEstimator, func(), error) {
	config := grpcconnection.ClientConfig{ServerAuthCAFile: *tls.ca, CertFile: *tls.cert, KeyFile: *tls.key}
	conn, err := config.DialWithTimeOut([]string{addr}, *tls.dialTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("dial: %w", err)
	}
	cache := estimatorclient.NewSchedulerEstimatorCache()
	cache.AddCluster(cluster, conn, estimatorservice.NewEstimatorClient(conn))
	return estimatorclient.NewSchedulerEstimator(cache, 5*time.Second), func() { conn.Close() }, nil
}

func unschedulable(args []string) error {
	flags := flag.NewFlagSet("unschedulable", flag.ContinueOnError)
	addr := flags.String("addr", "", "the estimator's host:port")
	cluster := flags.String("cluster", "member", "the member cluster's name")
	namespace := flags.String("namespace", "default", "the workload's namespace")
	name := flags.String("name", "", "the workload's name")
	kind := flags.String("kind", "Deployment", "the workload's kind")
	apiVersion := flags.String("api-version", "apps/v1", "the workload's apiVersion")
	threshold := flags.Duration("threshold", 0, "how long a replica must have been unschedulable")
	tls := addTLSFlags(flags)
	if err := flags.Parse(args); err != nil {
		return err
	}
	accurate, closeConn, err := connect(*addr, *cluster, tls)
	if err != nil {
		return err
	}
	defer closeConn()
	answer, err := accurate.GetUnschedulableReplicas(context.Background(), []string{*cluster},
		&workv1alpha2.ObjectReference{APIVersion: *apiVersion, Kind: *kind, Namespace: *namespace, Name: *name},
		*threshold)
	if err != nil {
		return fmt.Errorf("scheduler estimator: %w", err)
	}
	// As for estimate: a failed call is UnauthenticReplica (-1) in Karmada's answer.
	if answer[0].Replicas < 0 {
		return fmt.Errorf("scheduler estimator: no answer for cluster %s (replicas %d)", *cluster, answer[0].Replicas)
	}
	out, err := json.Marshal(map[string]int32{"unschedulable": answer[0].Replicas})
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// moduleDir is where the Go module cache holds module `path` at the version this build used.
func moduleDir(path string) (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build info")
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			if dep.Replace != nil {
				dep = dep.Replace
			}
			cache := os.Getenv("GOMODCACHE")
			if cache == "" {
				gopath := os.Getenv("GOPATH")
				if gopath == "" {
					home, err := os.UserHomeDir()
					if err != nil {
						return "", err
					}
					gopath = filepath.Join(home, "go")
				}
				cache = filepath.Join(gopath, "pkg", "mod")
			}
			return filepath.Join(cache, path+"@"+dep.Version), nil
		}
	}
	return "", fmt.Errorf("module %s is not a dependency of this build", path)
}

var messageBlock = regexp.MustCompile(`(?ms)^message (\w+) \{\n.*?^\}\n`)

func checkProtos(dir string) error {
	karmada, err := moduleDir("github.com/karmada-io/karmada")
	if err != nil {
		return err
	}
	var problems []string
	for _, file := range []string{"pkg/estimator/pb/estimator.proto", "pkg/estimator/service/service.proto"} {
		ours, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		theirs, err := os.ReadFile(filepath.Join(karmada, file))
		if err != nil {
			return err
		}
		if string(ours) != string(theirs) {
			problems = append(problems, fmt.Sprintf("%s differs from %s", file, karmada))
		}
	}
	for module, file := range map[string]string{
		"k8s.io/api":          "core/v1/generated.proto",
		"k8s.io/apimachinery": "pkg/api/resource/generated.proto",
	} {
		root, err := moduleDir(module)
		if err != nil {
			return err
		}
		ours, err := os.ReadFile(filepath.Join(dir, module, file))
		if err != nil {
			return err
		}
		theirs, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return err
		}
		upstream := map[string]string{}
		for _, m := range messageBlock.FindAllStringSubmatch(string(theirs), -1) {
			upstream[m[1]] = m[0]
		}
		kept := messageBlock.FindAllStringSubmatch(string(ours), -1)
		if len(kept) == 0 {
			problems = append(problems, fmt.Sprintf("%s/%s keeps no message", module, file))
		}
		for _, m := range kept {
			if upstream[m[1]] != m[0] {
				problems = append(problems, fmt.Sprintf("%s/%s: message %s differs from %s", module, file, m[1], root))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	fmt.Printf("protos match karmada %s\n", filepath.Base(karmada))
	return nil
}
