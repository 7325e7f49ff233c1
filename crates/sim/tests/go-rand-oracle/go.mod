// Test tooling only: Go's own math/rand, to check that src/sim/go_rand.rs draws the same values
// (tests/go_rand.rs runs it). Nothing here is linked into gpu-extender.
module gpu-extender/tests/go-rand-oracle

go 1.22
