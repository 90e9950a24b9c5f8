package entstore

// BatchStatements returns the batch statements by name, as a store that
// reads the server's clock runs them (the release without wake-ups).
func BatchStatements() map[string]string {
	return map[string]string{
		"free":    acquireFreeBatchSQL,
		"acquire": acquireBatchSQL[0],
		"take":    takeBatchSQL[0],
		"renew":   renewBatchSQL,
		"release": releaseBatch(nil, ""),
	}
}
