package locks_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// The keywords and characters the fuzz builds its DSNs from: libpq
// keywords whose values pgx accepts whatever they hold, and values with
// the characters that need quoting or escaping.
var (
	fuzzKeys     = []string{"host", "dbname", "user", "password", "application_name", "options"}
	fuzzValueSet = "ab1.- '\\/="
	fuzzSpaces   = []string{"", " ", "\t", "\n ", "  "}
)

type fuzzPair struct {
	key, value    string
	quoted        bool
	before, after string // the white space around "="
}

// fuzzPairs builds one to four pairs from data, deterministically.
func fuzzPairs(data []byte) []fuzzPair {
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := int(data[0])
		data = data[1:]
		return b
	}
	pairs := make([]fuzzPair, 1+next()%4)
	for i := range pairs {
		p := fuzzPair{key: fuzzKeys[next()%len(fuzzKeys)], quoted: next()%2 == 1,
			before: fuzzSpaces[next()%len(fuzzSpaces)], after: fuzzSpaces[next()%len(fuzzSpaces)]}
		for n := 1 + next()%6; n > 0; n-- {
			p.value += string(fuzzValueSet[next()%len(fuzzValueSet)])
		}
		pairs[i] = p
	}
	return pairs
}

// render writes a pair as libpq reads it; open leaves a quoted value's
// quote unclosed.
func (p fuzzPair) render(open bool) string {
	v := p.value
	if p.quoted || open {
		v = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v)
		if !open {
			v += "'"
		}
	} else {
		v = strings.NewReplacer(`\`, `\\`, `'`, `\'`, " ", `\ `).Replace(v)
	}
	return p.key + p.before + "=" + p.after + v
}

func renderPairs(pairs []fuzzPair) string {
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = p.render(false)
	}
	return strings.Join(out, " ")
}

// FuzzKeywordValueNeighbours builds valid libpq keyword/value DSNs (pgx's
// parser is the oracle), then breaks one in a way a person does: a keyword
// without its value, a stray word, a quote that never closes, a keyword
// in upper case. The valid DSN must be PostgreSQL; the broken one must be
// refused with a ValidationError, and never taken for a SQLite file.
//
//	go test . -run '^$' -fuzz FuzzKeywordValueNeighbours -fuzztime 60s
func FuzzKeywordValueNeighbours(f *testing.F) {
	for _, seed := range [][]byte{{0}, {3, 0, 1, 2, 3, 4, 5, 6, 7}, {2, 4, 0, 1, 1, 3, 9, 9, 9, 5, 1, 0, 2}, []byte("host=db user=me")} {
		for m := range uint8(4) {
			f.Add(seed, m, uint8(1))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, mutation, at uint8) {
		pairs := fuzzPairs(data)
		valid := renderPairs(pairs)
		_, err := pgconn.ParseConfig(valid)
		require.NoError(t, err, "the oracle refuses %q", valid)
		require.True(t, locks.IsPostgres(valid), "%q", valid)
		require.NoError(t, locks.ValidateDatabase(valid), "%q", valid)

		i := int(at) % len(pairs)
		broken := append([]fuzzPair(nil), pairs...)
		words := make([]string, len(broken))
		for j, p := range broken {
			words[j] = p.render(false)
		}
		switch mutation % 4 {
		case 0: // a keyword without its value
			words[i] = broken[i].key
		case 1: // a stray word
			words = append(words[:i], append([]string{"stray"}, words[i:]...)...)
		case 2: // a quote that never closes, in the last value
			i = len(words) - 1
			words[i] = broken[i].render(true)
		case 3: // a keyword in upper case
			broken[i].key = strings.ToUpper(broken[i].key)
			words[i] = broken[i].render(false)
		}
		bad := strings.Join(words, " ")
		if mutation%4 != 3 {
			_, err := pgconn.ParseConfig(bad)
			require.Error(t, err, "the oracle accepts %q", bad)
		}
		assert.False(t, locks.IsPostgres(bad), "%q", bad)
		var ve *domain.ValidationError
		require.ErrorAs(t, locks.ValidateDatabase(bad), &ve, "%q is taken for a SQLite file", bad)
		assert.Equal(t, "database", ve.Field)
	})
}
