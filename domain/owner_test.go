package domain_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

func TestParseProcessOwner(t *testing.T) {
	p := domain.ProcessOwner{Host: "build-7", PID: 4242, Nonce: "0a1b2c3d",
		BootID: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", PIDNamespace: 4026531836, StartTime: 123456}
	got, ok := domain.ParseProcessOwner(p.String())
	require.True(t, ok, p.String())
	assert.Equal(t, p, got)
	require.NoError(t, domain.ValidateOwner(p.String()))

	grouped := p
	grouped.Group = 4250
	assert.Equal(t, p.String()+":g4250", grouped.String())
	got, ok = domain.ParseProcessOwner(grouped.String())
	require.True(t, ok, grouped.String())
	assert.Equal(t, grouped, got)

	for _, owner := range []string{
		"alice",
		"build-7:4242:0a1b2c3d", // the older default: no proof of its process
		"build-7:4242:0a1b2c3d/proc2:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456",
		"build-7:0:0a1b2c3d/proc1:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456",
		"build-7:4242:0a1b2c3d/proc1:not-a-boot-id:4026531836:123456",
		"build-7:4242:0a1b2c3d/proc1:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456 ",
		"a/b:4242:0a1b2c3d/proc1:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456",
		"build-7:4242:0a1b2c3d/proc1:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456:g0",
		"build-7:4242:0a1b2c3d/proc1:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456:g",
		"build-7:4242:0a1b2c3d/proc1:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456:4250",
		"build-7:4242:0a1b2c3d/proc1:6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9:4026531836:123456:g99999999999999999999",
	} {
		_, ok := domain.ParseProcessOwner(owner)
		assert.False(t, ok, "%q names no process", owner)
	}
}
