package kubestate

// Encode is encode, for the external tests (which import the sandbox, and so the permission
// package, which imports this one for KeyPattern).
var Encode = encode
