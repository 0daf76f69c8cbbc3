package docslinks

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Link is one Markdown link found in a file.
type Link struct {
	File   string // the .md file, relative to the root
	Line   int
	Target string // as written: path[#anchor]
}

// linkRE matches inline links and images: [text](target) with an optional
// "title". Reference-style links are not used in this tree.
var linkRE = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// inlineCode matches `code` spans, whose text is not Markdown.
var inlineCode = regexp.MustCompile("`[^`]*`")

// skipDirs are directories never searched for Markdown.
var skipDirs = map[string]bool{".git": true, "_output": true, "testdata": true, "node_modules": true}

// walkFiles calls fn with the path, relative to root, of every file below
// root, skipping skipDirs.
func walkFiles(root string, fn func(rel string) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && skipDirs[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return fn(rel)
	})
}

// MarkdownFiles lists the .md files below root, relative to it.
func MarkdownFiles(root string) ([]string, error) {
	var files []string
	err := walkFiles(root, func(rel string) error {
		if strings.HasSuffix(rel, ".md") {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// scan reads a Markdown file and returns its links (outside code) and the
// anchors of its headings.
func scan(root, file string) ([]Link, map[string]bool, error) {
	f, err := os.Open(filepath.Join(root, file))
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var links []Link
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if h, ok := heading(line); ok {
			a := Anchor(h)
			// GitHub numbers repeated headings: x, x-1, x-2, ...
			if k := seen[a]; k > 0 {
				anchors[fmt.Sprintf("%s-%d", a, k)] = true
			} else {
				anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range linkRE.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			links = append(links, Link{File: file, Line: n, Target: m[1]})
		}
	}
	return links, anchors, sc.Err()
}

// heading returns the text of an ATX heading line ("## Text").
func heading(line string) (string, bool) {
	t := strings.TrimLeft(line, "#")
	if len(t) == len(line) || len(line)-len(t) > 6 || !strings.HasPrefix(t, " ") {
		return "", false
	}
	return strings.TrimSpace(t), true
}

// Anchor is the id GitHub gives a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces as '-'.
func Anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// external tells whether a target leaves the repository.
func external(target string) bool {
	for _, p := range []string{"http://", "https://", "mailto:"} {
		if strings.HasPrefix(target, p) {
			return true
		}
	}
	return false
}

// Check returns one error per relative link below root that names no
// existing file, or a heading its page does not have.
func Check(root string) ([]error, error) {
	files, err := MarkdownFiles(root)
	if err != nil {
		return nil, err
	}
	pages := map[string]map[string]bool{} // .md file -> its anchors
	var links []Link
	for _, f := range files {
		l, a, err := scan(root, f)
		if err != nil {
			return nil, err
		}
		links = append(links, l...)
		pages[filepath.ToSlash(f)] = a
	}
	var errs []error
	for _, l := range links {
		if external(l.Target) {
			continue
		}
		path, anchor, _ := strings.Cut(l.Target, "#")
		dest := l.File
		if path != "" {
			if filepath.IsAbs(path) {
				errs = append(errs, fmt.Errorf("%s:%d: %s: absolute path; link relative to the file", l.File, l.Line, l.Target))
				continue
			}
			dest = filepath.Join(filepath.Dir(l.File), path)
			if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %s: no such file or directory", l.File, l.Line, l.Target))
				continue
			}
		}
		if anchor == "" {
			continue
		}
		a, ok := pages[filepath.ToSlash(dest)]
		if !ok {
			continue // an anchor into a file that is not Markdown: not checked
		}
		if !a[anchor] {
			errs = append(errs, fmt.Errorf("%s:%d: %s: %s has no heading #%s", l.File, l.Line, l.Target, dest, anchor))
		}
	}
	return errs, nil
}
