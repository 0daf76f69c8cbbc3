// Package micro holds Go micro-benchmarks of the shim's hot paths whose
// packages have none of their own. Today that is rendering a domain's XML
// (vm.Render); the config drive and NUMA benchmarks live beside their code.
// Run with the others, in benchstat's input format:
//
//	go test -run '^$' -bench . -benchmem -count 6 ./vm/ ./configdrive/ ./numa/ ./bench/micro/
package micro
