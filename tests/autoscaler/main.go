// Command test-autoscaler is the node-group autoscaler of the autoscaling end-to-end scenarios:
// it decides like cluster-autoscaler's kwok cloud provider does, and is built from Go modules by
// scripts/autoscaler-bins.sh. cluster-autoscaler itself (k8s.io/autoscaler/cluster-autoscaler)
// is not served by the Go module proxy, so this stand-in reproduces the part of it that matters
// to a scheduler extender: the scale-up simulation runs kube-scheduler's own in-tree plugins
// (PreFilter + Filter of the default profile, DynamicResources off, no extenders; the contract
// k8s.io/kubernetes/pkg/scheduler/framework/autoscaler_contract pins for cluster-autoscaler) on
// the live nodes and on node templates, and node groups come from a kwok-provider templates file.
//
// Loop, every --scan-interval:
//   - scale-up: every pending pod kube-scheduler marked Unschedulable is first simulated on the
//     existing nodes (pods already placed in the simulation count); one that fits is left alone
//     (cluster-autoscaler's "filter out schedulable"). One that fits nowhere gets a new node from
//     the first node group (templates file order, like --expander=priority) whose template it
//     fits, below the group's max-count; later pods of the same scan may fit that new node.
//   - scale-down: a node of a group with no pods left but finished ones, DaemonSet and mirror
//     pods, for --scale-down-unneeded-time, no sooner than --scale-down-delay-after-add after the
//     last scale-up, above the group's min-count, is deleted (cluster-autoscaler also drains
//     underused nodes whose pods fit elsewhere; this stand-in removes empty nodes only).
//
// Every decision is one log line starting "scale-up:", "no scale-up:" or "scale-down:".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	schedcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	"sigs.k8s.io/yaml"
)

const (
	// The kwok cloud provider's names: the label node groups are formed by, the template
	// annotations bounding a group, and the annotation kwok selects the nodes it runs by.
	groupLabel     = "node.kubernetes.io/instance-type"
	minAnnotation  = "cluster-autoscaler.kwok.nodegroup/min-count"
	maxAnnotation  = "cluster-autoscaler.kwok.nodegroup/max-count"
	kwokAnnotation = "kwok.x-k8s.io/node"
	// Set on every node this autoscaler adds: the group it belongs to.
	ownerLabel = "autoscaler.gpu-extender.io/node-group"
)

type nodeGroup struct {
	name     string
	min, max int
	template *v1.Node
}

type autoscaler struct {
	client        kubernetes.Interface
	fwk           framework.Framework
	sim           *simulation
	groups        []nodeGroup
	unneededTime  time.Duration
	delayAfterAdd time.Duration
	lastScaleUp   time.Time
	unneededSince map[string]time.Time
	added         int
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	templates := flag.String("templates", "", "node templates: a v1 List of Nodes (the kwok provider's templates ConfigMap content)")
	scanInterval := flag.Duration("scan-interval", 10*time.Second, "how often to scale up or down")
	unneededTime := flag.Duration("scale-down-unneeded-time", 10*time.Minute, "how long a node must be empty before it is removed")
	delayAfterAdd := flag.Duration("scale-down-delay-after-add", 10*time.Minute, "no scale-down sooner than this after a scale-up")
	klog.InitFlags(nil)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *kubeconfig, *templates, *scanInterval, *unneededTime, *delayAfterAdd); err != nil {
		klog.ErrorS(err, "test-autoscaler failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, templates string, scan, unneeded, delay time.Duration) error {
	groups, err := loadGroups(templates)
	if err != nil {
		return err
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	sim := &simulation{current: schedcache.NewEmptySnapshot()}
	fwk, err := newFramework(ctx, client, sim)
	if err != nil {
		return err
	}
	a := &autoscaler{
		client: client, fwk: fwk, sim: sim, groups: groups,
		unneededTime: unneeded, delayAfterAdd: delay,
		unneededSince: map[string]time.Time{},
	}
	for _, g := range groups {
		klog.InfoS("node group", "group", g.name, "min", g.min, "max", g.max)
	}
	ticker := time.NewTicker(scan)
	defer ticker.Stop()
	for {
		if err := a.scan(ctx); err != nil {
			klog.ErrorS(err, "scan failed")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// loadGroups reads the templates file: one node group per template, named by its instance type.
func loadGroups(path string) ([]nodeGroup, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list v1.NodeList
	if err := yaml.UnmarshalStrict(data, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var groups []nodeGroup
	for i := range list.Items {
		t := &list.Items[i]
		name := t.Labels[groupLabel]
		if name == "" {
			return nil, fmt.Errorf("%s: template %d has no %s label", path, i, groupLabel)
		}
		lo, err := countAnnotation(t, minAnnotation, 0)
		if err != nil {
			return nil, err
		}
		hi, err := countAnnotation(t, maxAnnotation, 1)
		if err != nil {
			return nil, err
		}
		groups = append(groups, nodeGroup{name: name, min: lo, max: hi, template: t})
	}
	if len(groups) == 0 {
		return nil, fmt.Errorf("%s: no node templates", path)
	}
	return groups, nil
}

func countAnnotation(t *v1.Node, key string, fallback int) (int, error) {
	text, ok := t.Annotations[key]
	if !ok {
		return fallback, nil
	}
	n, err := strconv.Atoi(text)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("template %s: %s=%q is not a count", t.Labels[groupLabel], key, text)
	}
	return n, nil
}

// newFramework builds kube-scheduler's default profile with the in-tree plugins, as
// cluster-autoscaler's simulator does; DynamicResources is off (cluster-autoscaler's
// --enable-dynamic-resource-allocation default).
func newFramework(ctx context.Context, client kubernetes.Interface, sim *simulation) (framework.Framework, error) {
	// The framework counts into kube-scheduler's metrics, which must exist (never served here).
	schedmetrics.Register()
	cfg, err := latest.Default()
	if err != nil {
		return nil, err
	}
	profile := cfg.Profiles[0]
	profile.Plugins.MultiPoint.Disabled = append(profile.Plugins.MultiPoint.Disabled, config.Plugin{Name: "DynamicResources"})
	factory := informers.NewSharedInformerFactory(client, 0)
	fwk, err := frameworkruntime.NewFramework(ctx, plugins.NewInTreeRegistry(), &profile,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSnapshotSharedLister(sim),
	)
	if err != nil {
		return nil, fmt.Errorf("scheduler framework: %w", err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return fwk, nil
}

func (a *autoscaler) scan(ctx context.Context) error {
	nodeList, err := a.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	podList, err := a.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	nodes := make([]*v1.Node, 0, len(nodeList.Items))
	for i := range nodeList.Items {
		nodes = append(nodes, &nodeList.Items[i])
	}
	var placed, pending []*v1.Pod
	for i := range podList.Items {
		p := &podList.Items[i]
		switch {
		case finished(p) || p.DeletionTimestamp != nil:
		case p.Spec.NodeName != "":
			placed = append(placed, p)
		case unschedulable(p):
			pending = append(pending, p)
		}
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i].CreationTimestamp.Before(&pending[j].CreationTimestamp) })
	scaledUp, err := a.scaleUp(ctx, nodes, placed, pending)
	if err != nil || scaledUp {
		return err
	}
	return a.scaleDown(ctx, nodes, podList.Items)
}

func (a *autoscaler) scaleUp(ctx context.Context, nodes []*v1.Node, placed, pending []*v1.Pod) (bool, error) {
	scaledUp := false
	for _, pod := range pending {
		if node := a.fits(ctx, pod, nodes, placed, nodes); node != "" {
			klog.InfoS("no scale-up: pod fits an existing node in the simulation", "pod", klog.KObj(pod), "node", node)
			placed = append(placed, onNode(pod, node))
			continue
		}
		added := false
		for _, g := range a.groups {
			size := 0
			for _, n := range nodes {
				if n.Labels[ownerLabel] == g.name {
					size++
				}
			}
			if size >= g.max {
				continue
			}
			candidate := a.fromTemplate(g, a.added+1)
			// A copy: appending to nodes could write into the array `nodes` shares.
			withCandidate := append(append(make([]*v1.Node, 0, len(nodes)+1), nodes...), candidate)
			if a.fits(ctx, pod, withCandidate, placed, []*v1.Node{candidate}) == "" {
				continue
			}
			created, err := a.client.CoreV1().Nodes().Create(ctx, candidate, metav1.CreateOptions{})
			if err != nil {
				return scaledUp, fmt.Errorf("adding a node to %s: %w", g.name, err)
			}
			a.added++
			klog.InfoS("scale-up: node added", "group", g.name, "node", created.Name, "pod", klog.KObj(pod), "size", size+1)
			nodes = append(nodes, created)
			placed = append(placed, onNode(pod, created.Name))
			a.lastScaleUp = time.Now()
			scaledUp, added = true, true
			break
		}
		if !added {
			klog.InfoS("no scale-up: pod fits no node group's template", "pod", klog.KObj(pod))
		}
	}
	return scaledUp, nil
}

// fits runs PreFilter and Filter for pod with `nodes` and `placed` as the cluster, on each of
// `candidates`; returns the first that passes, or "".
func (a *autoscaler) fits(ctx context.Context, pod *v1.Pod, nodes []*v1.Node, placed []*v1.Pod, candidates []*v1.Node) string {
	snapshot := schedcache.NewSnapshot(placed, nodes)
	a.sim.current = snapshot
	state := framework.NewCycleState()
	if _, status, _ := a.fwk.RunPreFilterPlugins(ctx, state, pod); !status.IsSuccess() {
		return ""
	}
	for _, candidate := range candidates {
		info, err := snapshot.NodeInfos().Get(candidate.Name)
		if err != nil {
			continue
		}
		if a.fwk.RunFilterPlugins(ctx, state.Clone(), pod, info).IsSuccess() {
			return candidate.Name
		}
	}
	return ""
}

func (a *autoscaler) scaleDown(ctx context.Context, nodes []*v1.Node, pods []v1.Pod) error {
	busy := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != "" && !finished(p) && !daemonOrMirror(p) {
			busy[p.Spec.NodeName] = true
		}
	}
	now := time.Now()
	sizes := map[string]int{}
	for _, n := range nodes {
		sizes[n.Labels[ownerLabel]]++
	}
	for _, n := range nodes {
		group := a.group(n.Labels[ownerLabel])
		if group == nil || busy[n.Name] {
			delete(a.unneededSince, n.Name)
			continue
		}
		since, ok := a.unneededSince[n.Name]
		if !ok {
			a.unneededSince[n.Name] = now
			klog.InfoS("node unneeded", "node", n.Name, "group", group.name)
			continue
		}
		if now.Sub(since) < a.unneededTime || now.Sub(a.lastScaleUp) < a.delayAfterAdd || sizes[group.name] <= group.min {
			continue
		}
		err := a.client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing %s: %w", n.Name, err)
		}
		klog.InfoS("scale-down: empty node removed", "node", n.Name, "group", group.name, "unneededFor", now.Sub(since).Round(time.Second))
		delete(a.unneededSince, n.Name)
		sizes[group.name]--
	}
	return nil
}

func (a *autoscaler) group(name string) *nodeGroup {
	for i := range a.groups {
		if a.groups[i].name == name {
			return &a.groups[i]
		}
	}
	return nil
}

// fromTemplate is the serial-th node this autoscaler adds, in group g: the template with a fresh name, the group label and
// kwok's annotation, status as the template gives it (capacity, allocatable; kwok sets Ready).
func (a *autoscaler) fromTemplate(g nodeGroup, serial int) *v1.Node {
	n := g.template.DeepCopy()
	n.Name = fmt.Sprintf("%s-%d", g.name, serial)
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels["kubernetes.io/hostname"] = n.Name
	n.Labels[ownerLabel] = g.name
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	delete(n.Annotations, minAnnotation)
	delete(n.Annotations, maxAnnotation)
	n.Annotations[kwokAnnotation] = "fake"
	n.ResourceVersion = ""
	return n
}

// simulation is the cluster the framework's plugins see: the framework keeps the lister it was
// built with, so that lister hands on to whichever snapshot the current check set.
type simulation struct{ current *schedcache.Snapshot }

func (s *simulation) NodeInfos() framework.NodeInfoLister       { return s.current.NodeInfos() }
func (s *simulation) StorageInfos() framework.StorageInfoLister { return s.current.StorageInfos() }

func onNode(pod *v1.Pod, node string) *v1.Pod {
	p := pod.DeepCopy()
	p.Spec.NodeName = node
	return p
}

func finished(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

func unschedulable(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

func daemonOrMirror(p *v1.Pod) bool {
	if _, mirror := p.Annotations[v1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	for _, owner := range p.OwnerReferences {
		if owner.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}
