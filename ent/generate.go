package ent

//go:generate go tool ent generate ./schema
