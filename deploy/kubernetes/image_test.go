package kubernetes_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// dockerfile is what image_test reads of the repository's Dockerfile.
type dockerfile struct {
	stages []stage
}

type stage struct {
	from, name string
	run        []string // RUN commands, continuation lines joined
	copies     []string // COPY instructions' arguments
	user       string
	entrypoint []string
}

// parseDockerfile reads the instructions this image uses (FROM, RUN,
// COPY, USER, ENTRYPOINT), continuation lines joined, comments skipped.
func parseDockerfile(data []byte) (*dockerfile, error) {
	d := &dockerfile{}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	cur := ""
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && cur == "") {
			continue
		}
		if rest, ok := strings.CutSuffix(l, "\\"); ok {
			cur += rest + " "
			continue
		}
		lines = append(lines, cur+l)
		cur = ""
	}
	for _, l := range lines {
		if l == "" {
			continue
		}
		instr, args, _ := strings.Cut(l, " ")
		args = strings.TrimSpace(args)
		if strings.ToUpper(instr) == "FROM" {
			f := strings.Fields(args)
			st := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			d.stages = append(d.stages, st)
			continue
		}
		if len(d.stages) == 0 {
			return nil, fmt.Errorf("Dockerfile: %s before FROM", instr)
		}
		st := &d.stages[len(d.stages)-1]
		switch strings.ToUpper(instr) {
		case "RUN":
			st.run = append(st.run, args)
		case "COPY":
			st.copies = append(st.copies, args)
		case "USER":
			st.user = args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(args), &st.entrypoint); err != nil {
				return nil, fmt.Errorf("Dockerfile: ENTRYPOINT %s: want the exec form, [\"...\"]: %v", args, err)
			}
		}
	}
	return d, nil
}

// buildLine is the Dockerfile's go build command, and its environment.
func (d *dockerfile) buildLine() (env map[string]string, args []string, err error) {
	for _, st := range d.stages {
		for _, r := range st.run {
			f := strings.Fields(r)
			env = map[string]string{}
			i := 0
			for ; i < len(f) && strings.Contains(f[i], "=") && !strings.HasPrefix(f[i], "-"); i++ {
				k, v, _ := strings.Cut(f[i], "=")
				env[k] = v
			}
			if i+1 < len(f) && f[i] == "go" && f[i+1] == "build" {
				return env, f[i:], nil
			}
		}
	}
	return nil, nil, fmt.Errorf("Dockerfile: no RUN ... go build")
}

var readmeDockerRE = regexp.MustCompile("(?m)^docker build -t (\\S+) \\.(\\s|$)")

// TestImage (issue 50, item 6): the repository's Dockerfile builds the
// image the Deployment runs, as the README says: its build line is the
// README's and names epp.yaml's image; the builder's Go is go.mod's
// release; the binary is static (CGO_ENABLED=0, GOOS=linux) and its
// packages build so (go list on them with that environment); the final
// stage is a static distroless base, runs as the Deployment's non-root
// user and starts the binary. docker cannot run here; set
// WARDEN_STATIC_BUILD=1 to build the binary with the Dockerfile's command
// and check that it is statically linked (minutes on a cold cache).
func TestImage(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(data)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := readmeDockerRE.FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no `docker build -t IMAGE .` line")
	}
	if !bytes.Contains(data, []byte("docker build -t "+string(m[1])+" .")) {
		t.Errorf("Dockerfile: its comment does not give the README's build line, docker build -t %s .", m[1])
	}
	b, err := parse(readManifests(t))
	if err != nil {
		t.Fatal(err)
	}
	eppDep, err := deployment(b, "warden-epp")
	if err != nil {
		t.Fatal(err)
	}
	c := eppDep.Spec.Template.Spec.Containers[0]
	if c.Image != string(m[1]) {
		t.Errorf("epp.yaml runs %s, the README builds %s", c.Image, m[1])
	}
	if len(d.stages) != 2 {
		t.Fatalf("Dockerfile: %d stages, want a builder and the image", len(d.stages))
	}
	builder, final := d.stages[0], d.stages[1]
	mf, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gm := regexp.MustCompile(`(?m)^go (\d+\.\d+)(\.\d+)?$`).FindSubmatch(mf)
	if gm == nil {
		t.Fatal("go.mod: no go line")
	}
	if !strings.HasPrefix(builder.from, "golang:"+string(gm[1])) {
		t.Errorf("Dockerfile: builder %s, want golang:%s (go.mod's go %s%s)", builder.from, gm[1], gm[1], gm[2])
	}
	env, args, err := d.buildLine()
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	for i, a := range args {
		if a == "-o" && i+1 < len(args) {
			out = args[i+1]
		}
	}
	if env["CGO_ENABLED"] != "0" || env["GOOS"] != "linux" || args[len(args)-1] != "./cmd/warden" || out == "" {
		t.Errorf("Dockerfile: build line %v %v: want CGO_ENABLED=0 GOOS=linux go build -o BIN ./cmd/warden", env, args)
	}
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") {
		t.Errorf("Dockerfile: final stage FROM %s: want a distroless static base (no libc: the binary is static)", final.from)
	}
	var binary string
	for _, cp := range final.copies {
		if f := strings.Fields(cp); len(f) == 3 && f[0] == "--from="+builder.name && f[1] == out {
			binary = f[2]
		}
	}
	if binary == "" || len(final.entrypoint) != 1 || final.entrypoint[0] != binary {
		t.Errorf("Dockerfile: ENTRYPOINT %v, want the binary copied from the builder (%s -> %s)", final.entrypoint, out, binary)
	}
	uid, _, _ := strings.Cut(final.user, ":")
	n, err := strconv.ParseInt(uid, 10, 64)
	sc := c.SecurityContext
	if err != nil || n == 0 || sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != n || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("Dockerfile: USER %q: want a numeric non-root user, the Deployment's runAsUser with runAsNonRoot", final.user)
	}

	// The packages build with the Dockerfile's environment: none needs
	// cgo, every import resolves.
	goEnv := append(os.Environ(), "GOFLAGS=-mod=mod")
	for k, v := range env {
		goEnv = append(goEnv, k+"="+v)
	}
	list := exec.Command("go", "list", "-e", "-deps", "-f", "{{if .Error}}{{.ImportPath}}: {{.Error}}{{end}}{{range .DepsErrors}}{{.}}{{end}}", "./cmd/warden")
	list.Dir, list.Env = root, goEnv
	o, err := list.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(o)) > 0 {
		t.Errorf("go list with %v: %v\n%s", env, err, o)
	}
	if os.Getenv("WARDEN_STATIC_BUILD") == "" {
		return
	}
	bin := filepath.Join(t.TempDir(), "warden")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/warden")
	build.Dir, build.Env = root, goEnv
	if o, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build: %v\n%s", err, o)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a dynamic loader: not static", bin)
		}
	}
}
