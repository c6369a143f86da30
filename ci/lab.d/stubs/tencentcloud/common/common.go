// Package common: kubexm lab stand-in (see ../README); pointer helpers only.
package common

func StringPtr(v string) *string { return &v }

func StringPtrs(vs []string) []*string {
	out := make([]*string, len(vs))
	for i := range vs {
		out[i] = &vs[i]
	}
	return out
}

func BoolPtr(v bool) *bool { return &v }
