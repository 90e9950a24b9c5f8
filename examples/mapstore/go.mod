module example.com/mapstore

go 1.26.0

require github.com/cleveragents/locks v0.0.0

require (
	github.com/benbjohnson/clock v1.3.5 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
)

// The lock module of this repository; a store of another repository
// requires a released version instead.
replace github.com/cleveragents/locks => ../..
