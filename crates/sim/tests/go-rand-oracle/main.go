// Prints the draws the reference simulator makes from Go's math/rand for one seed, in its order:
// Int once, Shuffle of the pods, Intn picks, Perm of the nodes; then Int31n and Int63n samples.
// One number per line, each section headed by its name.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand"
	"os"
)

func main() {
	seed := flag.Int64("seed", 42, "the seed")
	pods := flag.Int("pods", 8152, "how many pods to shuffle")
	picks := flag.Int("picks", 3000, "how many Intn(pods) draws")
	nodes := flag.Int("nodes", 1213, "the Perm size")
	flag.Parse()

	r := rand.New(rand.NewSource(*seed))
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()

	fmt.Fprintf(out, "int\n%d\n", r.Int())
	order := make([]int, *pods)
	for i := range order {
		order[i] = i
	}
	r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	fmt.Fprintln(out, "shuffle")
	for _, v := range order {
		fmt.Fprintln(out, v)
	}
	fmt.Fprintln(out, "intn")
	for i := 0; i < *picks; i++ {
		fmt.Fprintln(out, r.Intn(*pods))
	}
	fmt.Fprintln(out, "perm")
	for _, v := range r.Perm(*nodes) {
		fmt.Fprintln(out, v)
	}
	fmt.Fprintln(out, "int31n")
	for _, n := range []int32{1, 2, 3, 7, 100, 1 << 20, 1<<31 - 1} {
		fmt.Fprintln(out, r.Int31n(n))
	}
	fmt.Fprintln(out, "int63n")
	for _, n := range []int64{1, 3, 1000, 1 << 40, 1<<62 + 12345} {
		fmt.Fprintln(out, r.Int63n(n))
	}
}
