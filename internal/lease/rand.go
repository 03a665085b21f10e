package lease

import "crypto/rand"

var randRead = rand.Read
