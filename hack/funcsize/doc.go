// Package funcsize measures the functions of the module's non-test Go
// files: how many lines each spans and how many parameters it takes. Its
// test holds the house limits (at most 80 lines, at most 5 parameters)
// over the whole tree, so a function that grows past them fails the unit
// tier instead of waiting for a review to notice.
package funcsize
