package web

// SampleReport is the report of the package's own tests, for the browser tests in package web_test.
var SampleReport = sampleReport

// SampleSimResult is the simulator result of the package's own tests.
var SampleSimResult = sampleSimResult
