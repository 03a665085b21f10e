package view

// Truncated is truncated, for the tests.
var Truncated = truncated
