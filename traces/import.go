package traces

import (
	"errors"
	"fmt"
	"io"
	"slices"
)

// ImportOptions tune the importers.
type ImportOptions struct {
	// BlockSize of the written trace (default 16).
	BlockSize int
	// SkipBad skips bad input lines, counting them, instead of stopping.
	SkipBad bool
}

// ImportResult counts what an importer did.
type ImportResult struct {
	Requests int `json:"requests"`
	Skipped  int `json:"skipped"`
	Sessions int `json:"sessions"`
}

// Importers lists the formats Import knows, in the order shown to users.
var Importers = []string{"mooncake", "bailian", "azure"}

// Import converts a public trace in format ("mooncake", "bailian" or
// "azure") read from in (plain or gzip) into requests written to out, whose
// header's BlockSize must equal opts.BlockSize. name is used in errors.
func Import(format string, in io.Reader, name string, out *Writer, opts ImportOptions) (ImportResult, error) {
	if opts.BlockSize == 0 {
		opts.BlockSize = 16
	}
	if out.Header().BlockSize != opts.BlockSize {
		return ImportResult{}, fmt.Errorf("import: the output's block size %d differs from the import's %d", out.Header().BlockSize, opts.BlockSize)
	}
	br, gz, err := maybeGzip(in)
	if err != nil {
		return ImportResult{}, fmt.Errorf("%s: %w", name, err)
	}
	if gz != nil {
		defer gz.Close()
	}
	var dec importDecoder
	switch format {
	case "mooncake":
		dec, err = newHashIDDecoder(br, name, opts, newMooncake(opts))
	case "bailian":
		dec, err = newHashIDDecoder(br, name, opts, newBailian())
	case "azure":
		dec, err = newAzureDecoder(br, name, opts)
	default:
		return ImportResult{}, fmt.Errorf("import: unknown format %q (want one of %v)", format, Importers)
	}
	if err != nil {
		return ImportResult{}, err
	}
	var res ImportResult
	for {
		r, err := dec.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var le *LineError
			if errors.As(err, &le) && opts.SkipBad {
				res.Skipped++
				continue
			}
			return res, err
		}
		if err := out.Write(r); err != nil {
			return res, err
		}
		res.Requests++
	}
	res.Sessions = dec.sessions()
	return res, nil
}

// importDecoder turns one foreign record after another into a Request with
// hash ids at the target block size and a session. A *LineError is a bad
// input line that the decoder has consumed (the caller may skip it).
type importDecoder interface {
	next() (*Request, error)
	sessions() int
}

// reblock converts the source block ids of a prompt of tokens tokens, in
// blocks of src tokens, into chained ids of dst-token blocks, appended to
// out. Either src is a multiple of dst (each source id expands into src/dst
// children; the last id covers only the remainder) or dst is a multiple of
// src (dst/src ids make one block). Child ids chain: equal source prefixes
// give equal ids block for block, and ids from different source positions
// never collide. The caller checks len(ids) == ceil(tokens/src).
func reblock(out, ids []uint64, tokens, src, dst int) []uint64 {
	parent := rootParent
	emit := func(words ...uint64) {
		h := newHasher(parent)
		for _, w := range words {
			h.add(w)
		}
		parent = h.sum()
		out = append(out, parent)
	}
	if src >= dst {
		per := src / dst
		for i, id := range ids {
			n := per
			if i == len(ids)-1 {
				n = ceilDiv(tokens-src*(len(ids)-1), dst)
			}
			for k := range n {
				emit(id, uint64(k))
			}
		}
		return out
	}
	per := dst / src
	for chunk := range slices.Chunk(ids, per) {
		emit(chunk...)
	}
	return out
}

// checkBlockSizes says whether blocks of src tokens convert into dst.
func checkBlockSizes(src, dst int) error {
	if dst < 1 || (src%dst != 0 && dst%src != 0) {
		return fmt.Errorf("import: block size %d does not divide, nor is a multiple of, the source's %d-token blocks", dst, src)
	}
	return nil
}
