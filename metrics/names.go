package metrics

import "github.com/lm-warden/warden/metrics/names"

// The series and label names and the bucket bounds are defined in package
// [names] (a leaf, without Prometheus, for live mode); these are the same
// names for the packages that already use metrics.
const (
	VLLMNumRequestsRunning      = names.VLLMNumRequestsRunning
	VLLMNumRequestsWaiting      = names.VLLMNumRequestsWaiting
	VLLMKVCacheUsagePerc        = names.VLLMKVCacheUsagePerc
	VLLMPrefixCacheQueries      = names.VLLMPrefixCacheQueries
	VLLMPrefixCacheHits         = names.VLLMPrefixCacheHits
	VLLMPromptTokens            = names.VLLMPromptTokens
	VLLMGenerationTokens        = names.VLLMGenerationTokens
	VLLMNumPreemptions          = names.VLLMNumPreemptions
	VLLMRequestSuccess          = names.VLLMRequestSuccess
	VLLMTimeToFirstToken        = names.VLLMTimeToFirstToken
	VLLMCacheConfigInfo         = names.VLLMCacheConfigInfo
	VLLMInterTokenLatency       = names.VLLMInterTokenLatency
	VLLMRequestQueueTime        = names.VLLMRequestQueueTime
	VLLMRequestPrefillTime      = names.VLLMRequestPrefillTime
	VLLMRequestDecodeTime       = names.VLLMRequestDecodeTime
	VLLME2ERequestLatency       = names.VLLME2ERequestLatency
	VLLMRequestPromptTokens     = names.VLLMRequestPromptTokens
	VLLMRequestGenerationTokens = names.VLLMRequestGenerationTokens
	VLLMIterationTokens         = names.VLLMIterationTokens
	WardenRequests              = names.WardenRequests
	WardenInFlight              = names.WardenInFlight
	WardenSessions              = names.WardenSessions
	WardenActiveSessions        = names.WardenActiveSessions
	WardenLaterTurns            = names.WardenLaterTurns
	WardenLaterTurnsHome        = names.WardenLaterTurnsHome
	WardenSessionsCompleted     = names.WardenSessionsCompleted
	WardenTTFB                  = names.WardenTTFB
	WardenOutputTokens          = names.WardenOutputTokens
	LabelName                   = names.LabelName
	LabelModelName              = names.LabelModelName
	LabelEngine                 = names.LabelEngine
	LabelFinishedReason         = names.LabelFinishedReason
	LabelBlockSize              = names.LabelBlockSize
	LabelNumGPUBlocks           = names.LabelNumGPUBlocks
	LabelGPUMemoryUtilization   = names.LabelGPUMemoryUtilization
	LabelEnablePrefixCaching    = names.LabelEnablePrefixCaching
	LabelModel                  = names.LabelModel
	LabelReplica                = names.LabelReplica
	LabelReason                 = names.LabelReason
	LabelLE                     = names.LabelLE
	FinishedStop                = names.FinishedStop
	FinishedLength              = names.FinishedLength
	BucketSuffix                = names.BucketSuffix
	SumSuffix                   = names.SumSuffix
	CountSuffix                 = names.CountSuffix
)

// VLLMTTFTBuckets is [names.VLLMTTFTBuckets].
func VLLMTTFTBuckets() []float64 { return names.VLLMTTFTBuckets() }

// WardenTTFBBuckets is [names.WardenTTFBBuckets].
func WardenTTFBBuckets() []float64 { return names.WardenTTFBBuckets() }

// WardenTTFBNative is [names.WardenTTFBNative].
func WardenTTFBNative() NativeOpts { return names.WardenTTFBNative() }

// VLLMITLBuckets is [names.VLLMITLBuckets].
func VLLMITLBuckets() []float64 { return names.VLLMITLBuckets() }

// VLLMRequestLatencyBuckets is [names.VLLMRequestLatencyBuckets].
func VLLMRequestLatencyBuckets() []float64 { return names.VLLMRequestLatencyBuckets() }

// VLLMTokenBuckets is [names.VLLMTokenBuckets].
func VLLMTokenBuckets(maxLen int) []float64 {
	return names.VLLMTokenBuckets(maxLen)
}

// VLLMIterationTokenBuckets is [names.VLLMIterationTokenBuckets].
func VLLMIterationTokenBuckets() []float64 { return names.VLLMIterationTokenBuckets() }
