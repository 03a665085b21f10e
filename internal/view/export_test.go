package view

// The renderers the views call, for the external tests that check each one's words.
var (
	Truncated           = truncated
	AnnotationText      = annotationText
	ApplyAnnotations    = applyAnnotations
	ApplyMarkdown       = applyMarkdown
	ApplyTimings        = applyTimings
	MarkerOf            = markerOf
	Apply               = applyTo
	PlanMarkdown        = planMarkdown
	RBAC                = rbacTo
	Release             = releaseTo
	StateList           = stateList
	ValidateAnnotations = validateAnnotations
	ValidateHuman       = validateHuman
	ValidateJSONTo      = validateJSONTo
)
